package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/template"
)

// TestTemplateVersionsByReference: a template version that is no longer current (a rebuild made
// another) stays while a sandbox — running, paused or in error — or a snapshot stands on it, and
// goes with the last of them; references of holders a crash left behind are dropped at start.
func TestTemplateVersionsByReference(t *testing.T) {
	ctx := context.Background()
	ts, err := template.New(template.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cur, err := ts.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatalf("build minimal (needs a static busybox): %v", err)
	}
	// An older version of minimal, as a recipe change leaves after a rebuild.
	oldDir := filepath.Join(filepath.Dir(filepath.Dir(cur.RootFS)), "0ld0000000000000")
	old := filepath.Join(oldDir, "rootfs")
	e := newTestEnv(t, func(c *Config) {
		c.TemplateRefs, c.Instance = ts, "ab12"
		c.Templates = func(context.Context, string) (Template, error) { return Template{RootFS: old}, nil }
	})
	if out, err := exec.Command("cp", "-a", filepath.Dir(cur.RootFS), oldDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	tn := "acme"
	running, paused := e.create(tn), e.create(tn)
	if _, err := e.m.Pause(ctx, tn, paused.ID); err != nil {
		t.Fatal(err)
	}
	snap, err := e.m.Snapshot(ctx, tn, running.ID, snapshot.Request{Kind: snapshot.KindFilesystem})
	if err != nil {
		t.Fatal(err)
	}
	holders := func() []string {
		h, err := ts.Holders(old)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	want := []string{"ab12/" + paused.ID, "ab12/" + running.ID, "ab12/" + snap.ID}
	slices.Sort(want)
	if got := holders(); !slices.Equal(got, want) {
		t.Fatalf("holders of the old version %v, want %v", got, want)
	}
	if err := ts.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("a version sandboxes and a snapshot stand on was collected: %v", err)
	}
	// A crash between a hold and its record leaves a holder nothing names: dropped at start.
	if err := ts.Hold(ctx, "ab12/sbx_gone", old); err != nil {
		t.Fatal(err)
	}
	if err := ts.Hold(ctx, "cd34/sbx_other_instance", old); err != nil { // not ours: kept
		t.Fatal(err)
	}
	e.restart()
	if got := holders(); slices.Contains(got, "ab12/sbx_gone") || !slices.Contains(got, "cd34/sbx_other_instance") {
		t.Fatalf("holders after restart %v: the dead holder of this instance must go, the other instance's stay", got)
	}
	if err := ts.Release("cd34/sbx_other_instance", old); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{running.ID, paused.ID} {
		if err := e.m.Delete(ctx, tn, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := ts.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the snapshot still stands on the old version, but it was collected: %v", err)
	}
	if err := e.m.DeleteSnapshot(ctx, tn, snap.ID); err != nil {
		t.Fatal(err)
	}
	if got := holders(); len(got) != 0 {
		t.Fatalf("holders after every user went: %v", got)
	}
	if err := ts.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Fatalf("an old version nothing stands on is kept: %v", err)
	}
	if _, err := os.Stat(cur.RootFS); err != nil {
		t.Fatalf("the current version was collected: %v", err)
	}
}
