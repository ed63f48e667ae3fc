package auth_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

func newKeys(t *testing.T) (*auth.Keys, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "db"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return auth.New(st), dir
}

func TestGeneratedAdminKey(t *testing.T) {
	k, dir := newKeys(t)
	ctx := context.Background()
	path, err := k.EnsureAdmin(ctx, dir, "")
	if err != nil || path != filepath.Join(dir, "admin.key") {
		t.Fatalf("EnsureAdmin = %q, %v", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v %v", fi, err)
	}
	b, _ := os.ReadFile(path)
	key := strings.TrimSpace(string(b))
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key) {
		t.Fatalf("key %q does not look like an E2B key", key)
	}
	p, err := k.Authenticate(ctx, key)
	if err != nil || !p.Admin || p.Tenant != auth.AdminTenant {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}
	// A second start generates nothing new.
	if path, err := k.EnsureAdmin(ctx, dir, ""); err != nil || path != "" {
		t.Fatalf("second EnsureAdmin = %q, %v", path, err)
	}
}

func TestConfiguredAdminKeyAndTenants(t *testing.T) {
	k, dir := newKeys(t)
	ctx := context.Background()
	if _, err := k.EnsureAdmin(ctx, dir, "e2b_feedface"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.EnsureAdmin(ctx, dir, "e2b_feedface"); err != nil {
		t.Fatalf("installing the same key twice: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "admin.key")); !os.IsNotExist(err) {
		t.Fatalf("a configured key must not be written to disk: %v", err)
	}
	if p, err := k.Authenticate(ctx, "e2b_feedface"); err != nil || !p.Admin {
		t.Fatalf("configured key: %+v %v", p, err)
	}
	_, key, err := k.Create(ctx, "team-a", false)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := k.Authenticate(ctx, key); err != nil || p.Admin || p.Tenant != "team-a" {
		t.Fatalf("tenant key: %+v %v", p, err)
	}
	for _, bad := range []string{"", "e2b_nope", strings.Repeat("x", 300)} {
		if _, err := k.Authenticate(ctx, bad); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("Authenticate(%.10q) = %v", bad, err)
		}
	}
	for _, bad := range []string{"", "Team", "a b", "../x", strings.Repeat("a", 64)} {
		if _, _, err := k.Create(ctx, bad, false); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(%q) = %v", bad, err)
		}
	}
}

func TestHashIsNotTheKey(t *testing.T) {
	key := auth.Generate()
	if h := auth.Hash(key); h == key || len(h) != 64 || strings.Contains(h, key[4:]) {
		t.Fatalf("hash %q of %q", h, key)
	}
	if auth.FromRequestHeaders("Bearer abc", "") != "abc" || auth.FromRequestHeaders("", " def ") != "def" || auth.FromRequestHeaders("Basic x", "") != "" {
		t.Fatal("header parsing")
	}
}
