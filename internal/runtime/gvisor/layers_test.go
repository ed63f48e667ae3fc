package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/runtime"
)

// TestLayersAndExport: a sandbox's writable layer, exported, becomes a layer of the next
// sandbox's root: its new files appear, its deletions (whiteouts) hide the template's files, and
// the template itself is untouched.
func TestLayersAndExport(t *testing.T) {
	h := newHost(t)
	d := h.newDriver(t)
	first := h.sandbox(t, d, runtime.Resources{})
	mustExec(t, h, first.ID, "/bin/sh", "-c", "mkdir -p /opt/app && echo layer1 > /opt/app/v && rm /bin/ls && sync")
	layer := filepath.Join(t.TempDir(), "layer1")
	if err := d.ExportLayer(t.Context(), first.ID, layer); err != nil {
		t.Fatalf("ExportLayer: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(layer, "opt/app/v")); err != nil || string(b) != "layer1\n" {
		t.Fatalf("exported layer: %q %v", b, err)
	}
	if err := d.ExportLayer(t.Context(), first.ID, filepath.Join(t.TempDir(), "again")); err == nil {
		t.Fatal("a second export of the same sandbox succeeded")
	}
	if _, err := os.Lstat(filepath.Join(h.rootfs, "bin/ls")); err != nil {
		t.Fatalf("template changed: %v", err)
	}

	netw, release := h.newNetwork(t)
	t.Cleanup(release)
	second := runtime.Spec{ID: "gv-" + randHex(4), RootFS: h.rootfs, Layers: []string{layer},
		AgentPath: h.agent, AgentToken: "tok", Network: netw}
	t.Cleanup(func() { d.Delete(context.Background(), second.ID) })
	if err := d.Create(t.Context(), second); err != nil {
		t.Fatalf("Create on a layer: %v", err)
	}
	out := mustExec(t, h, second.ID, "/bin/sh", "-c", "cat /opt/app/v; test -e /bin/ls && echo ls-present || echo ls-gone")
	if strings.TrimSpace(out) != "layer1\nls-gone" {
		t.Fatalf("second sandbox sees %q", out)
	}
	// Its writes go to its own upper, not into the shared layer.
	mustExec(t, h, second.ID, "/bin/sh", "-c", "echo changed > /opt/app/v && sync")
	if b, _ := os.ReadFile(filepath.Join(layer, "opt/app/v")); string(b) != "layer1\n" {
		t.Fatalf("layer was written: %q", b)
	}
	// A missing layer is refused before anything is made.
	bad := second
	bad.ID, bad.Layers = "gv-"+randHex(4), []string{filepath.Join(t.TempDir(), "missing")}
	if err := d.Create(t.Context(), bad); err == nil {
		d.Delete(context.Background(), bad.ID)
		t.Fatal("Create with a missing layer succeeded")
	}
}
