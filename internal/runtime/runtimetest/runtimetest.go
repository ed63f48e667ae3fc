// Package runtimetest is the conformance suite for runtime.Driver: every driver's tests call Run
// with a real root filesystem, agent binary and network slots, and the suite checks the contract
// written on the interface (lifecycle, idempotent Delete, cleanup after failures, concurrency)
// and, for drivers that have them, the optional abilities: checkpoint/restore
// (runtime.Checkpointer), Freeze and WritableLayer (runtime.LayerCapturer), Thaw, ExportLayer
// and Usage. A case for an ability the driver lacks is skipped (found by type assertion), as is
// a case that needs an Env hook the driver's test does not provide. Only _test.go files import
// it.
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// Env is what the suite needs from the driver's test.
type Env struct {
	// RootFS is a template root filesystem with a busybox userland (sh, sleep, cat, ps, hostname).
	RootFS string
	// AgentPath is the binary each sandbox runs as its init; it must keep running.
	AgentPath string
	// NewNetwork makes a fresh network slot and returns it with a func that removes it.
	NewNetwork func(t *testing.T) (runtime.Network, func())
	// Exec runs argv in a running sandbox and returns its combined output. Optional: the cases
	// that look inside sandboxes are skipped without it.
	Exec func(ctx context.Context, id string, argv ...string) (string, error)
	// StartProcess starts shell command cmd in sandbox id as the agent would: as a descendant
	// of the sandbox's init, not as a runtime-level exec session (gVisor, for one, kills those
	// on restore). Optional: checking that processes survive checkpoint/restore needs it.
	StartProcess func(ctx context.Context, id, cmd string) error
	// WriteFile writes data to the file at path (absolute as the sandbox sees it, in a directory
	// the template has, such as /root) in running sandbox id, through the sandbox; ReadFile reads
	// one so. path must land at path in the sandbox's writable layer. Optional (both or
	// neither): the cases that follow files through checkpoints, freezes and exports need them.
	WriteFile func(ctx context.Context, id, path string, data []byte) error
	ReadFile  func(ctx context.Context, id, path string) ([]byte, error)
	// Pause leaves running sandbox id paused, as a caller that died in the middle of a Freeze
	// would (gVisor: runsc pause). Optional: the Thaw case needs it.
	Pause func(ctx context.Context, id string) error
	// Leftovers lists what the driver left on the host for id (processes, mounts, files,
	// cgroups…); nothing when clean. Optional, but every real driver should provide it.
	Leftovers func(t *testing.T, id string) []string
}

// Run runs the conformance suite. newDriver returns a driver with fresh state for one subtest; it
// may register cleanups on t that check the driver left nothing at all.
func Run(t *testing.T, newDriver func(t *testing.T) runtime.Driver, env Env) {
	s := &suite{env: env, newDriver: newDriver}
	t.Run("Available", s.testAvailable)
	t.Run("Lifecycle", s.testLifecycle)
	t.Run("DeleteIdempotent", s.testDeleteIdempotent)
	t.Run("DuplicateID", s.testDuplicateID)
	t.Run("TwoAtOnce", s.testTwoAtOnce)
	t.Run("CreateFailureLeavesNothing", s.testCreateFailure)
	t.Run("SandboxView", s.testSandboxView)
	t.Run("WritableLayer", s.testWritableLayer)
	t.Run("CheckpointRestore", s.testCheckpointRestore)
	t.Run("RestoreFailureLeavesNothing", s.testRestoreFailure)
	t.Run("CheckpointKeepsFiles", s.testCheckpointKeepsFiles)
	t.Run("Freeze", s.testFreeze)
	t.Run("Thaw", s.testThaw)
	t.Run("Usage", s.testUsage)
	t.Run("ExportLayer", s.testExportLayer)
}

type suite struct {
	env       Env
	newDriver func(t *testing.T) runtime.Driver
}

// opTimeout bounds one driver call; generous for a loaded two-core CI machine.
const opTimeout = 60 * time.Second

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

func newID(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "rtt-" + hex.EncodeToString(b[:])
}

// spec returns a spec with a fresh ID and network slot. The slot is removed after the sandbox:
// cleanups run last-registered first, and the safety-net Delete is registered after the slot.
func (s *suite) spec(t *testing.T, d runtime.Driver) runtime.Spec {
	t.Helper()
	netw, release := s.env.NewNetwork(t)
	t.Cleanup(release)
	id := newID(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := d.Delete(ctx, id); err != nil {
			t.Errorf("cleanup Delete(%s): %v", id, err)
		}
	})
	return runtime.Spec{
		ID:         id,
		RootFS:     s.env.RootFS,
		AgentPath:  s.env.AgentPath,
		AgentToken: "token-" + id,
		Env:        map[string]string{"SPACE_TEST_VAR": "value of " + id},
		Hostname:   "host-" + id,
		Resources:  runtime.Resources{VCPUs: 1, MemoryMiB: 512, Pids: 1024},
		Network:    netw,
	}
}

func (s *suite) mustState(t *testing.T, d runtime.Driver, id string, want runtime.State) {
	t.Helper()
	got, err := d.State(ctxFor(t), id)
	if err != nil {
		t.Fatalf("State(%s): %v", id, err)
	}
	if got != want {
		t.Fatalf("State(%s) = %s, want %s", id, got, want)
	}
}

func (s *suite) listed(t *testing.T, d runtime.Driver, id string) bool {
	t.Helper()
	ids, err := d.List(ctxFor(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return slices.Contains(ids, id)
}

// deleteClean deletes id and checks that it is gone without trace.
func (s *suite) deleteClean(t *testing.T, d runtime.Driver, id string) {
	t.Helper()
	if err := d.Delete(ctxFor(t), id); err != nil {
		t.Fatalf("Delete(%s): %v", id, err)
	}
	s.assertGone(t, d, id)
}

func (s *suite) assertGone(t *testing.T, d runtime.Driver, id string) {
	t.Helper()
	s.mustState(t, d, id, runtime.StateUnknown)
	if s.listed(t, d, id) {
		t.Errorf("List still has %s", id)
	}
	if s.env.Leftovers != nil {
		if left := s.env.Leftovers(t, id); len(left) > 0 {
			t.Errorf("left behind for %s:\n  %s", id, strings.Join(left, "\n  "))
		}
	}
}

func (s *suite) exec(t *testing.T, id string, argv ...string) string {
	t.Helper()
	out, err := s.env.Exec(ctxFor(t), id, argv...)
	if err != nil {
		t.Fatalf("exec %v in %s: %v\n%s", argv, id, err, out)
	}
	return out
}

func (s *suite) needExec(t *testing.T) {
	if s.env.Exec == nil {
		t.Skip("Env.Exec not provided")
	}
}

func (s *suite) testAvailable(t *testing.T) {
	d := s.newDriver(t)
	if err := d.Available(ctxFor(t)); err != nil {
		t.Fatalf("Available: %v", err)
	}
	if d.Name() == "" {
		t.Error("Name is empty")
	}
}

func (s *suite) testLifecycle(t *testing.T) {
	d := s.newDriver(t)
	spec := s.spec(t, d)
	s.mustState(t, d, spec.ID, runtime.StateUnknown)
	if err := d.Create(ctxFor(t), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	s.mustState(t, d, spec.ID, runtime.StateRunning)
	if !s.listed(t, d, spec.ID) {
		t.Errorf("List lacks %s", spec.ID)
	}
	s.deleteClean(t, d, spec.ID)
}

func (s *suite) testDeleteIdempotent(t *testing.T) {
	d := s.newDriver(t)
	if err := d.Delete(ctxFor(t), newID(t)); err != nil {
		t.Errorf("Delete of an ID never created: %v", err)
	}
	spec := s.spec(t, d)
	if err := d.Create(ctxFor(t), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	s.deleteClean(t, d, spec.ID)
	if err := d.Delete(ctxFor(t), spec.ID); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	s.assertGone(t, d, spec.ID)
}

func (s *suite) testDuplicateID(t *testing.T) {
	d := s.newDriver(t)
	spec := s.spec(t, d)
	if err := d.Create(ctxFor(t), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	err := d.Create(ctxFor(t), spec)
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Create with the same ID: err = %v, want ErrAlreadyExists", err)
	}
	// The failed Create must not have hurt the first sandbox.
	s.mustState(t, d, spec.ID, runtime.StateRunning)
	s.deleteClean(t, d, spec.ID)
}

func (s *suite) testTwoAtOnce(t *testing.T) {
	d := s.newDriver(t)
	specs := []runtime.Spec{s.spec(t, d), s.spec(t, d)}
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i := range specs {
		wg.Go(func() { errs[i] = d.Create(ctxFor(t), specs[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Create %s: %v", specs[i].ID, err)
		}
	}
	for _, sp := range specs {
		s.mustState(t, d, sp.ID, runtime.StateRunning)
		if !s.listed(t, d, sp.ID) {
			t.Errorf("List lacks %s", sp.ID)
		}
	}
	s.deleteClean(t, d, specs[0].ID)
	s.mustState(t, d, specs[1].ID, runtime.StateRunning)
	if s.env.Exec != nil {
		if out := s.exec(t, specs[1].ID, "/bin/echo", "alive"); strings.TrimSpace(out) != "alive" {
			t.Errorf("second sandbox after deleting the first: %q", out)
		}
	}
	s.deleteClean(t, d, specs[1].ID)
}

func (s *suite) testCreateFailure(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		edit  func(*runtime.Spec)
		class error // nil: any error
	}{
		{"missing rootfs", func(sp *runtime.Spec) { sp.RootFS = filepath.Join(t.TempDir(), "nope") }, errdefs.ErrInvalidArgument},
		{"rootfs is a file", func(sp *runtime.Spec) { sp.RootFS = notDir }, errdefs.ErrInvalidArgument},
		{"missing agent", func(sp *runtime.Spec) { sp.AgentPath = filepath.Join(t.TempDir(), "nope") }, errdefs.ErrInvalidArgument},
		{"bad ID", func(sp *runtime.Spec) { sp.ID = "../escape" }, errdefs.ErrInvalidArgument},
		// Fails late, inside the runtime, after the driver has made things to clean up.
		{"missing netns", func(sp *runtime.Spec) { sp.Network.NetNSPath = "/run/netns/space-test-does-not-exist" }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := s.newDriver(t)
			spec := s.spec(t, d)
			tt.edit(&spec)
			err := d.Create(ctxFor(t), spec)
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if tt.class != nil && !errors.Is(err, tt.class) {
				t.Errorf("err = %v, want class %v", err, tt.class)
			}
			if spec.ID != "../escape" {
				s.assertGone(t, d, spec.ID)
			}
		})
	}
}

// testSandboxView checks what the agent sees: its environment, token and hostname.
func (s *suite) testSandboxView(t *testing.T) {
	s.needExec(t)
	d := s.newDriver(t)
	spec := s.spec(t, d)
	if err := d.Create(ctxFor(t), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	environ := s.exec(t, spec.ID, "/bin/sh", "-c", "tr '\\0' '\\n' < /proc/1/environ")
	for _, want := range []string{
		"SPACE_AGENT_TOKEN=" + spec.AgentToken,
		"SPACE_TEST_VAR=" + spec.Env["SPACE_TEST_VAR"],
		"PATH=",
	} {
		if !strings.Contains(environ, want) {
			t.Errorf("agent environment lacks %q:\n%s", want, environ)
		}
	}
	if got := strings.TrimSpace(s.exec(t, spec.ID, "/bin/hostname")); got != spec.Hostname {
		t.Errorf("hostname = %q, want %q", got, spec.Hostname)
	}
	s.checkAddress(t, spec)
	s.deleteClean(t, d, spec.ID)
}

// checkAddress checks that the sandbox sees its network slot's address.
func (s *suite) checkAddress(t *testing.T, spec runtime.Spec) {
	t.Helper()
	if !spec.Network.GuestIP.IsValid() {
		return
	}
	out := s.exec(t, spec.ID, "/bin/sh", "-c", "ip -o addr")
	if !strings.Contains(out, " "+spec.Network.GuestIP.String()+" ") {
		t.Errorf("sandbox %s does not have its slot's address %s:\n%s", spec.ID, spec.Network.GuestIP, out)
	}
}

// testWritableLayer checks that each sandbox writes to its own layer, never to the template.
func (s *suite) testWritableLayer(t *testing.T) {
	s.needExec(t)
	d := s.newDriver(t)
	a, b := s.spec(t, d), s.spec(t, d)
	for _, sp := range []runtime.Spec{a, b} {
		if err := d.Create(ctxFor(t), sp); err != nil {
			t.Fatalf("Create: %v", err)
		}
	}
	s.exec(t, a.ID, "/bin/sh", "-c", "echo a > /root/mine && echo a > /tmp/mine && echo changed >> /etc/hosts && rm /etc/group")
	if out, err := s.env.Exec(ctxFor(t), b.ID, "/bin/cat", "/root/mine"); err == nil {
		t.Errorf("sandbox b sees a's file: %q", out)
	}
	if out := s.exec(t, b.ID, "/bin/cat", "/etc/group"); !strings.Contains(out, "root") {
		t.Errorf("sandbox b lost /etc/group after a removed its own: %q", out)
	}
	for _, p := range []string{"root/mine", "tmp/mine"} {
		if _, err := os.Lstat(filepath.Join(s.env.RootFS, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("template rootfs was written: %s: %v", p, err)
		}
	}
	if hosts, _ := os.ReadFile(filepath.Join(s.env.RootFS, "etc/hosts")); strings.Contains(string(hosts), "changed") {
		t.Error("template /etc/hosts was modified")
	}
	if _, err := os.Lstat(filepath.Join(s.env.RootFS, "etc/group")); err != nil {
		t.Errorf("template /etc/group: %v", err)
	}
	s.deleteClean(t, d, a.ID)
	s.deleteClean(t, d, b.ID)
}

// markerCmd is a process that must survive checkpoint and restore.
const markerCmd = "sleep 32123"

func (s *suite) hasMarkerProcess(t *testing.T, id string) bool {
	t.Helper()
	if s.env.StartProcess == nil {
		return true // not checkable
	}
	return strings.Contains(s.exec(t, id, "/bin/ps", "-o", "args"), markerCmd)
}

// startMarker starts markerCmd and waits until it runs.
func (s *suite) startMarker(t *testing.T, id string) {
	t.Helper()
	if s.env.StartProcess == nil {
		t.Log("Env.StartProcess not provided: not checking that processes survive")
		return
	}
	if err := s.env.StartProcess(ctxFor(t), id, markerCmd); err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !s.hasMarkerProcess(t, id) {
		if time.Now().After(deadline) {
			t.Fatal("marker process did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *suite) testCheckpointRestore(t *testing.T) {
	d := s.newDriver(t)
	cp, ok := d.(runtime.Checkpointer)
	if !ok {
		t.Skipf("driver %s is not a Checkpointer", d.Name())
	}
	if err := cp.Checkpoint(ctxFor(t), newID(t), t.TempDir(), runtime.CheckpointOptions{LeaveRunning: true}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Checkpoint of an unknown ID: err = %v, want ErrNotFound", err)
	}
	withExec := s.env.Exec != nil

	orig := s.spec(t, d)
	if err := d.Create(ctxFor(t), orig); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if withExec {
		s.exec(t, orig.ID, "/bin/sh", "-c", "echo root-file > /root/before && echo tmp-file > /tmp/before")
		s.startMarker(t, orig.ID)
	}

	// A checkpoint that leaves the sandbox running.
	live := filepath.Join(t.TempDir(), "live")
	start := time.Now()
	if err := cp.Checkpoint(ctxFor(t), orig.ID, live, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint(leaveRunning): %v", err)
	}
	t.Logf("checkpoint with leaveRunning: %v", time.Since(start))
	s.mustState(t, d, orig.ID, runtime.StateRunning)
	if withExec {
		s.exec(t, orig.ID, "/bin/sh", "-c", "echo later > /root/after")
	}

	// Restore it twice at once, into new IDs and network slots (a fork).
	forks := []runtime.Spec{s.spec(t, d), s.spec(t, d)}
	var wg sync.WaitGroup
	errs := make([]error, len(forks))
	start = time.Now()
	for i := range forks {
		wg.Go(func() { errs[i] = cp.Restore(ctxFor(t), forks[i], live) })
	}
	wg.Wait()
	t.Logf("two concurrent restores: %v", time.Since(start))
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Restore %s: %v", forks[i].ID, err)
		}
	}
	for _, f := range forks {
		s.mustState(t, d, f.ID, runtime.StateRunning)
		if !withExec {
			continue
		}
		if got := s.exec(t, f.ID, "/bin/cat", "/root/before", "/tmp/before"); got != "root-file\ntmp-file\n" {
			t.Errorf("restored %s files = %q", f.ID, got)
		}
		if out, err := s.env.Exec(ctxFor(t), f.ID, "/bin/cat", "/root/after"); err == nil {
			t.Errorf("restored %s has a file written after the checkpoint: %q", f.ID, out)
		}
		if !s.hasMarkerProcess(t, f.ID) {
			t.Errorf("restored %s lost its running process", f.ID)
		}
		// A checkpoint restores into any slot and takes that slot's addresses.
		s.checkAddress(t, f)
	}
	// Forks are independent of each other.
	if withExec {
		s.exec(t, forks[0].ID, "/bin/sh", "-c", "echo fork0 > /root/fork")
		if out, err := s.env.Exec(ctxFor(t), forks[1].ID, "/bin/cat", "/root/fork"); err == nil {
			t.Errorf("fork 1 sees fork 0's write: %q", out)
		}
	}

	// A checkpoint that stops the sandbox, then restore into the next slot.
	final := filepath.Join(t.TempDir(), "final")
	if err := cp.Checkpoint(ctxFor(t), orig.ID, final, runtime.CheckpointOptions{Durable: true}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if st, err := d.State(ctxFor(t), orig.ID); err != nil || st == runtime.StateRunning {
		t.Errorf("State after Checkpoint without leaveRunning = %s, %v; want not running", st, err)
	}
	s.deleteClean(t, d, orig.ID)
	resumed := s.spec(t, d)
	if err := cp.Restore(ctxFor(t), resumed, final); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	s.mustState(t, d, resumed.ID, runtime.StateRunning)
	if withExec {
		if got := s.exec(t, resumed.ID, "/bin/cat", "/root/before", "/root/after"); got != "root-file\nlater\n" {
			t.Errorf("resumed files = %q", got)
		}
		if !s.hasMarkerProcess(t, resumed.ID) {
			t.Error("resumed sandbox lost its running process")
		}
	}
	// A restored sandbox can be checkpointed and restored again.
	again := filepath.Join(t.TempDir(), "again")
	if err := cp.Checkpoint(ctxFor(t), resumed.ID, again, runtime.CheckpointOptions{Durable: true}); err != nil {
		t.Fatalf("second-generation Checkpoint: %v", err)
	}
	s.deleteClean(t, d, resumed.ID)
	gen2 := s.spec(t, d)
	if err := cp.Restore(ctxFor(t), gen2, again); err != nil {
		t.Fatalf("second-generation Restore: %v", err)
	}
	if withExec && !s.hasMarkerProcess(t, gen2.ID) {
		t.Error("second-generation restore lost its running process")
	}
	for _, id := range []string{forks[0].ID, forks[1].ID, gen2.ID} {
		s.deleteClean(t, d, id)
	}
}

func (s *suite) testRestoreFailure(t *testing.T) {
	d := s.newDriver(t)
	cp, ok := d.(runtime.Checkpointer)
	if !ok {
		t.Skipf("driver %s is not a Checkpointer", d.Name())
	}
	garbage := t.TempDir()
	if err := os.WriteFile(filepath.Join(garbage, "image"), []byte("not a checkpoint"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{
		"empty dir":   t.TempDir(),
		"missing dir": filepath.Join(t.TempDir(), "nope"),
		"garbage":     garbage,
	} {
		t.Run(name, func(t *testing.T) {
			spec := s.spec(t, d)
			if err := cp.Restore(ctxFor(t), spec, dir); err == nil {
				t.Fatal("Restore succeeded")
			} else {
				t.Logf("Restore: %v", err)
			}
			s.assertGone(t, d, spec.ID)
		})
	}
}
