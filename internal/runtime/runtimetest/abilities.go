package runtimetest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// Cases for the optional abilities other than checkpoint/restore's own lifecycle.

func (s *suite) needFiles(t *testing.T) {
	if s.env.WriteFile == nil || s.env.ReadFile == nil {
		t.Skip("Env.WriteFile and Env.ReadFile not provided")
	}
}

func (s *suite) writeFile(t *testing.T, id, path, data string) {
	t.Helper()
	if err := s.env.WriteFile(ctxFor(t), id, path, []byte(data)); err != nil {
		t.Fatalf("write %s in %s: %v", path, id, err)
	}
}

func (s *suite) readFile(t *testing.T, id, path string) string {
	t.Helper()
	b, err := s.env.ReadFile(ctxFor(t), id, path)
	if err != nil {
		t.Fatalf("read %s in %s: %v", path, id, err)
	}
	return string(b)
}

// create makes a running sandbox with a fresh spec.
func (s *suite) create(t *testing.T, d runtime.Driver) runtime.Spec {
	t.Helper()
	spec := s.spec(t, d)
	if err := d.Create(ctxFor(t), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return spec
}

// testCheckpointKeepsFiles: a file written through the sandbox is in a sandbox restored from a
// checkpoint taken with LeaveRunning, the original runs on, and what it writes afterwards stays
// its own.
func (s *suite) testCheckpointKeepsFiles(t *testing.T) {
	s.needFiles(t)
	d := s.newDriver(t)
	cp, ok := d.(runtime.Checkpointer)
	if !ok {
		t.Skipf("driver %s is not a Checkpointer", d.Name())
	}
	orig := s.create(t, d)
	s.writeFile(t, orig.ID, "/root/cp-before", "before checkpoint\n")

	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "stray"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cp.Checkpoint(ctxFor(t), orig.ID, full, runtime.CheckpointOptions{LeaveRunning: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Checkpoint into a non-empty directory: err = %v, want ErrInvalidArgument", err)
	}
	s.mustState(t, d, orig.ID, runtime.StateRunning)

	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := cp.Checkpoint(ctxFor(t), orig.ID, dir, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint(leaveRunning): %v", err)
	}
	s.mustState(t, d, orig.ID, runtime.StateRunning)
	// Still serving, and with its files.
	if got := s.readFile(t, orig.ID, "/root/cp-before"); got != "before checkpoint\n" {
		t.Errorf("original after checkpoint: %q", got)
	}
	s.writeFile(t, orig.ID, "/root/cp-after", "after checkpoint\n")

	restored := s.spec(t, d)
	if err := cp.Restore(ctxFor(t), restored, dir); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	s.mustState(t, d, restored.ID, runtime.StateRunning)
	if got := s.readFile(t, restored.ID, "/root/cp-before"); got != "before checkpoint\n" {
		t.Errorf("restored file = %q", got)
	}
	if b, err := s.env.ReadFile(ctxFor(t), restored.ID, "/root/cp-after"); err == nil {
		t.Errorf("restored sandbox has a file written after the checkpoint: %q", b)
	}
	s.writeFile(t, restored.ID, "/root/cp-restored", "restored\n")
	if b, err := s.env.ReadFile(ctxFor(t), orig.ID, "/root/cp-restored"); err == nil {
		t.Errorf("original sees the restored sandbox's write: %q", b)
	}
	s.deleteClean(t, d, orig.ID)
	s.deleteClean(t, d, restored.ID)
}

// testFreeze: Freeze reports the sandbox paused while fn runs, hands fn the writable layer with
// the files written so far, returns fn's error and lets the sandbox go on.
func (s *suite) testFreeze(t *testing.T) {
	d := s.newDriver(t)
	lc, ok := d.(runtime.LayerCapturer)
	if !ok {
		t.Skipf("driver %s is not a LayerCapturer", d.Name())
	}
	unknown := newID(t)
	if _, err := lc.WritableLayer(unknown); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("WritableLayer of an unknown ID: err = %v, want ErrNotFound", err)
	}
	if err := lc.Freeze(ctxFor(t), unknown, func(string) error {
		t.Error("Freeze of an unknown ID called fn")
		return nil
	}); err == nil {
		t.Error("Freeze of an unknown ID succeeded")
	}

	spec := s.create(t, d)
	files := s.env.WriteFile != nil && s.env.ReadFile != nil
	if files {
		s.writeFile(t, spec.ID, "/root/frozen", "written before the freeze\n")
	}
	layer, err := lc.WritableLayer(spec.ID)
	if err != nil {
		t.Fatalf("WritableLayer: %v", err)
	}
	if st, err := os.Stat(layer); err != nil || !st.IsDir() {
		t.Fatalf("WritableLayer %s is not a directory: %v", layer, err)
	}
	errFn := errors.New("fn failed")
	called := false
	err = lc.Freeze(ctxFor(t), spec.ID, func(dir string) error {
		called = true
		if dir != layer {
			t.Errorf("fn's directory = %s, WritableLayer = %s", dir, layer)
		}
		s.mustState(t, d, spec.ID, runtime.StatePaused)
		if files {
			if b, err := os.ReadFile(filepath.Join(dir, "root/frozen")); err != nil || string(b) != "written before the freeze\n" {
				t.Errorf("layer while frozen: root/frozen = %q, %v", b, err)
			}
		}
		return errFn
	})
	if !called {
		t.Fatal("Freeze did not call fn")
	}
	if !errors.Is(err, errFn) {
		t.Errorf("Freeze = %v, want fn's error", err)
	}
	s.mustState(t, d, spec.ID, runtime.StateRunning)
	if files {
		s.writeFile(t, spec.ID, "/root/thawed", "after the freeze\n")
		if b, err := os.ReadFile(filepath.Join(layer, "root/thawed")); err != nil || string(b) != "after the freeze\n" {
			t.Errorf("a write after the freeze is not in the layer: %q, %v", b, err)
		}
	}
	if err := lc.Freeze(ctxFor(t), spec.ID, func(string) error { return nil }); err != nil {
		t.Errorf("second Freeze: %v", err)
	}
	s.mustState(t, d, spec.ID, runtime.StateRunning)
	s.deleteClean(t, d, spec.ID)
}

// testThaw: a sandbox left paused goes on with Thaw; Thaw of a running one is refused.
func (s *suite) testThaw(t *testing.T) {
	d := s.newDriver(t)
	th, ok := d.(runtime.Thawer)
	if !ok {
		t.Skipf("driver %s is not a Thawer", d.Name())
	}
	if s.env.Pause == nil {
		t.Skip("Env.Pause not provided")
	}
	if err := th.Thaw(ctxFor(t), newID(t)); err == nil {
		t.Error("Thaw of an unknown ID succeeded")
	}
	spec := s.create(t, d)
	if err := th.Thaw(ctxFor(t), spec.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Thaw of a running sandbox: err = %v, want ErrFailedPrecondition", err)
	}
	if err := s.env.Pause(ctxFor(t), spec.ID); err != nil {
		t.Fatalf("Env.Pause: %v", err)
	}
	s.mustState(t, d, spec.ID, runtime.StatePaused)
	if !s.listed(t, d, spec.ID) {
		t.Errorf("List lacks paused %s", spec.ID)
	}
	if err := th.Thaw(ctxFor(t), spec.ID); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	s.mustState(t, d, spec.ID, runtime.StateRunning)
	if s.env.WriteFile != nil && s.env.ReadFile != nil {
		s.writeFile(t, spec.ID, "/root/thawed", "thawed\n")
		if got := s.readFile(t, spec.ID, "/root/thawed"); got != "thawed\n" {
			t.Errorf("after Thaw: %q", got)
		}
	}
	// A paused sandbox is deleted like any other.
	if err := s.env.Pause(ctxFor(t), spec.ID); err != nil {
		t.Fatalf("Env.Pause: %v", err)
	}
	s.deleteClean(t, d, spec.ID)
}

// testUsage: Usage of a running sandbox reports its memory limit, memory within it, CPU time
// that does not go back and a disk use that counts what it wrote.
func (s *suite) testUsage(t *testing.T) {
	d := s.newDriver(t)
	ur, ok := d.(runtime.UsageReporter)
	if !ok {
		t.Skipf("driver %s is not a UsageReporter", d.Name())
	}
	if _, err := ur.Usage(ctxFor(t), newID(t)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Usage of an unknown ID: err = %v, want ErrNotFound", err)
	}
	spec := s.create(t, d)
	const size = 256 << 10
	files := s.env.WriteFile != nil
	if files {
		s.writeFile(t, spec.ID, "/root/usage", strings.Repeat("u", size))
	}
	first, err := ur.Usage(ctxFor(t), spec.ID)
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	t.Logf("usage: %+v", first)
	if want := spec.Resources.MemoryMiB << 20; first.MemoryLimit != want {
		t.Errorf("MemoryLimit = %d, want the spec's %d", first.MemoryLimit, want)
	}
	if first.MemoryBytes < 0 || first.MemoryBytes > first.MemoryLimit {
		t.Errorf("MemoryBytes = %d, want within 0..%d", first.MemoryBytes, first.MemoryLimit)
	}
	if first.CPUSeconds < 0 {
		t.Errorf("CPUSeconds = %v", first.CPUSeconds)
	}
	if files && first.DiskBytes < size {
		t.Errorf("DiskBytes = %d after writing %d bytes", first.DiskBytes, size)
	}
	second, err := ur.Usage(ctxFor(t), spec.ID)
	if err != nil {
		t.Fatalf("second Usage: %v", err)
	}
	if second.CPUSeconds < first.CPUSeconds {
		t.Errorf("CPUSeconds went back: %v then %v", first.CPUSeconds, second.CPUSeconds)
	}
	s.deleteClean(t, d, spec.ID)
}

// testExportLayer: ExportLayer stops the sandbox and leaves its writable layer at dest, with the
// files it wrote and whiteouts for what it removed; dest outlives Delete.
func (s *suite) testExportLayer(t *testing.T) {
	d := s.newDriver(t)
	ex, ok := d.(runtime.LayerExporter)
	if !ok {
		t.Skipf("driver %s is not a LayerExporter", d.Name())
	}
	if err := ex.ExportLayer(ctxFor(t), newID(t), filepath.Join(t.TempDir(), "layer")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ExportLayer of an unknown ID: err = %v, want ErrNotFound", err)
	}
	spec := s.create(t, d)
	files := s.env.WriteFile != nil
	if files {
		s.writeFile(t, spec.ID, "/root/exported", "in the layer\n")
	}
	if s.env.Exec != nil {
		s.exec(t, spec.ID, "/bin/rm", "/etc/group")
	}
	if err := ex.ExportLayer(ctxFor(t), spec.ID, t.TempDir()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ExportLayer to an existing directory: err = %v, want ErrInvalidArgument", err)
	}
	s.mustState(t, d, spec.ID, runtime.StateRunning)

	dest := filepath.Join(t.TempDir(), "sub", "layer")
	if err := ex.ExportLayer(ctxFor(t), spec.ID, dest); err != nil {
		t.Fatalf("ExportLayer: %v", err)
	}
	if st, err := d.State(ctxFor(t), spec.ID); err != nil || st == runtime.StateRunning {
		t.Errorf("State after ExportLayer = %s, %v; want not running", st, err)
	}
	s.deleteClean(t, d, spec.ID)
	if st, err := os.Stat(dest); err != nil || !st.IsDir() {
		t.Fatalf("exported layer %s after Delete: %v", dest, err)
	}
	if files {
		if b, err := os.ReadFile(filepath.Join(dest, "root/exported")); err != nil || !bytes.Equal(b, []byte("in the layer\n")) {
			t.Errorf("exported root/exported = %q, %v", b, err)
		}
	}
	if s.env.Exec != nil {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(dest, "etc/group"), &st); err != nil {
			t.Errorf("no whiteout for the removed /etc/group: %v", err)
		} else if st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != 0 {
			t.Errorf("etc/group in the layer is mode %o rdev %d, want a whiteout (character device 0/0)", st.Mode, st.Rdev)
		}
	}
}
