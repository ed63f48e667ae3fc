package template

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/space-sandbox/space/internal/errdefs"
)

func TestUserTemplates(t *testing.T) {
	ctx := context.Background()
	s, err := New(Config{Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	layer := func(key, file string) string {
		p, exists, err := s.LayerPath(key)
		if err != nil || exists {
			t.Fatalf("LayerPath(%s) = %q %v %v", key, p, exists, err)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(p, file), []byte("x"), 0o644)
		return p
	}
	l1, l2 := layer("1111111111111111", "a"), layer("2222222222222222", "b")
	if _, exists, _ := s.LayerPath("1111111111111111"); !exists {
		t.Fatal("layer not found again")
	}
	if _, _, err := s.LayerPath("../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad key: %v", err)
	}
	one, err := s.Save(ctx, Template{Name: "one", RootFS: base, Layers: []string{l1}, Env: map[string]string{"A": "1"}, WorkingDir: "/app", Parent: "minimal"})
	if err != nil || one.SizeBytes != 1 || one.CreatedAt.IsZero() {
		t.Fatalf("Save: %+v %v", one, err)
	}
	if _, err := s.Save(ctx, Template{Name: "two", RootFS: base, Layers: []string{l1, l2}, Parent: "one"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Ensure(ctx, "one")
	if err != nil || got.Env["A"] != "1" || got.WorkingDir != "/app" || len(got.Layers) != 1 || got.Layers[0] != l1 {
		t.Fatalf("Ensure: %+v %v", got, err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("List: %+v %v", list, err)
	}
	for _, bad := range []Template{{Name: "minimal", RootFS: base}, {Name: "Bad Name", RootFS: base}, {Name: "x"}} {
		if _, err := s.Save(ctx, bad); err == nil {
			t.Errorf("Save(%+v) succeeded", bad)
		}
	}
	if err := s.Delete(ctx, "minimal", nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("delete built-in: %v", err)
	}
	if err := s.Delete(ctx, "nope", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete missing: %v", err)
	}
	// Deleting "two" frees layer 2 only; layer 1 is still one's.
	if err := s.Delete(ctx, "two", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l2); !os.IsNotExist(err) {
		t.Fatalf("unused layer kept: %v", err)
	}
	if _, err := os.Stat(l1); err != nil {
		t.Fatalf("used layer removed: %v", err)
	}
	if _, err := s.Ensure(ctx, "two"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted template found: %v", err)
	}
}
