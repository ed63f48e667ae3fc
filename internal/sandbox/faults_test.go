package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/runtime/fake"
	"github.com/space-sandbox/space/internal/snapshot"
)

// writeLayer puts a file straight into running sandbox id's writable layer (the fake's layer is
// a host directory).
func (e *testEnv) writeLayer(id, name, content string) {
	e.t.Helper()
	dir, err := e.drv.WritableLayer(id)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// readLayer reads a file of running sandbox id as it sees it: from its writable layer, else
// from the topmost read-only layer that has it ("" if none does).
func (e *testEnv) readLayer(tenant, id, name string) string {
	e.t.Helper()
	dir, err := e.drv.WritableLayer(id)
	if err != nil {
		e.t.Fatalf("writable layer of %s: %v", id, err)
	}
	info, err := e.m.Get(context.Background(), tenant, id)
	if err != nil {
		e.t.Fatal(err)
	}
	dirs := []string{dir}
	for i := len(info.Spec.Layers) - 1; i >= 0; i-- {
		dirs = append(dirs, info.Spec.Layers[i])
	}
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, name)); err == nil {
			return string(b)
		}
	}
	return ""
}

// waitState waits up to 10 s for sandbox id to be in want.
func (e *testEnv) waitState(tenant, id string, want State) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.state(tenant, id) != want {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s is %s, want %s", id, e.state(tenant, id), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// blocker is an OnPause hook that holds the checkpoints of chosen sandboxes until released.
type blocker struct {
	mu      sync.Mutex
	ids     map[string]bool
	entered chan string
	release chan struct{}
	once    sync.Once
}

func newBlocker(ids ...string) *blocker {
	b := &blocker{ids: map[string]bool{}, entered: make(chan string, 16), release: make(chan struct{})}
	for _, id := range ids {
		b.ids[id] = true
	}
	return b
}

func (b *blocker) hook(ctx context.Context, op fake.Op, id string) error {
	b.mu.Lock()
	hold := b.ids[id] && op == fake.OpCheckpoint
	b.mu.Unlock()
	if !hold {
		return nil
	}
	b.entered <- id
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *blocker) open() { b.once.Do(func() { close(b.release) }) }

// waitEntered waits until the hook holds a checkpoint.
func (b *blocker) waitEntered(t *testing.T) string {
	t.Helper()
	select {
	case id := <-b.entered:
		return id
	case <-time.After(10 * time.Second):
		t.Fatal("no checkpoint reached the blocking hook")
		return ""
	}
}

// TestRecoverInterruptedPause: a restart after a pause that got as far as the driver's
// checkpoint takes only a marked checkpoint for a paused sandbox (which then resumes with its
// files); an unmarked whole one is tried and the sandbox runs again; an unmarked broken one is
// not a pause: the sandbox comes back from its latest full snapshot, or is in error.
func TestRecoverInterruptedPause(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	const tn = "acme"
	marked, whole, broken, snapped := e.create(tn), e.create(tn), e.create(tn), e.create(tn)
	for _, sb := range []Info{marked, whole, broken, snapped} {
		e.writeLayer(sb.ID, "f", "before the pause of "+sb.ID)
	}
	e.writeLayer(snapped.ID, "f", "in the full snapshot")
	if _, err := e.m.Snapshot(ctx, tn, snapped.ID, snapshot.Request{Kind: snapshot.KindFull}); err != nil {
		t.Fatal(err)
	}
	e.writeLayer(snapped.ID, "f", "after the full snapshot")

	e.crashInPause(marked.ID, true)
	e.crashInPause(whole.ID, false)
	for _, sb := range []Info{broken, snapped} {
		e.crashInPause(sb.ID, false)
		// Cut short: the driver's manifest never reached the disk.
		if err := os.Remove(filepath.Join(e.m.checkpointDir(sb.ID), fake.ManifestFile)); err != nil {
			t.Fatal(err)
		}
	}
	e.restart()

	if s := e.state(tn, marked.ID); s != StatePaused {
		t.Errorf("marked checkpoint: %s, want paused", s)
	}
	if _, err := e.m.Resume(ctx, tn, marked.ID); err != nil {
		t.Fatalf("resume of the marked checkpoint: %v", err)
	}
	if got := e.readLayer(tn, marked.ID, "f"); got != "before the pause of "+marked.ID {
		t.Errorf("resumed sandbox's file: %q", got)
	}

	if s := e.state(tn, whole.ID); s != StateRunning {
		t.Errorf("unmarked whole checkpoint: %s, want running", s)
	} else if got := e.readLayer(tn, whole.ID, "f"); got != "before the pause of "+whole.ID {
		t.Errorf("file of the sandbox resumed from an unmarked checkpoint: %q", got)
	}

	if s := e.state(tn, broken.ID); s != StateError {
		t.Errorf("unmarked broken checkpoint, no snapshot: %s, want error", s)
	}
	if s := e.state(tn, snapped.ID); s != StateRunning {
		t.Errorf("unmarked broken checkpoint and a full snapshot: %s, want running", s)
	} else if got := e.readLayer(tn, snapped.ID, "f"); got != "in the full snapshot" {
		t.Errorf("file of the sandbox recovered from its full snapshot: %q", got)
	}
	for _, sb := range []Info{marked, whole, broken, snapped} {
		if e.hasCheckpointDir(sb.ID) {
			t.Errorf("%s: checkpoint left after recovery", sb.ID)
		}
		// Each works: a command runs (or, in error, it can be deleted).
		if e.state(tn, sb.ID) == StateRunning {
			if _, err := e.m.Exec(ctx, tn, sb.ID, ExecOptions{Argv: []string{"true"}}); err != nil {
				t.Errorf("exec in %s after recovery: %v", sb.ID, err)
			}
		}
		if err := e.m.Delete(ctx, tn, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	for ed := range e.st.seen() {
		if !allowed[ed] {
			t.Errorf("the store was told %s → %s", ed.from, ed.to)
		}
	}
	e.checkClean()
}

// TestNoRoomForCheckpoint: a pause or fork of a sandbox whose memory the disk under StateDir
// cannot hold is refused with ErrInsufficientStorage before anything is touched: it runs on, no
// checkpoint directory, no state change.
func TestNoRoomForCheckpoint(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	const tn = "acme"
	sb := e.create(tn)
	e.drv.MemoryInUse = func(string) int64 { return 1 << 50 } // a PiB: no test disk holds it
	edges := len(e.st.seen())
	if _, err := e.m.Pause(ctx, tn, sb.ID); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Errorf("pause: %v, want insufficient storage", err)
	}
	if _, err := e.m.Fork(ctx, tn, sb.ID, 1); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Errorf("fork: %v, want insufficient storage", err)
	}
	if s := e.state(tn, sb.ID); s != StateRunning {
		t.Errorf("state %s, want running", s)
	}
	if st, _ := e.drv.State(ctx, sb.ID); st != runtime.StateRunning {
		t.Errorf("runtime %s, want running", st)
	}
	if e.hasCheckpointDir(sb.ID) {
		t.Error("a refused pause left a checkpoint directory")
	}
	if entries, _ := os.ReadDir(filepath.Join(e.stateDir, "forks")); len(entries) > 0 {
		t.Errorf("a refused fork left %d entries in forks/", len(entries))
	}
	if n := len(e.st.seen()); n != edges {
		t.Errorf("a refused pause changed a state (%d → %d kinds of change)", edges, n)
	}
	if _, err := e.m.Exec(ctx, tn, sb.ID, ExecOptions{Argv: []string{"true"}}); err != nil {
		t.Errorf("exec after the refused pause: %v", err)
	}
	// With the room there the same pause works.
	e.drv.MemoryInUse = nil
	if _, err := e.m.Pause(ctx, tn, sb.ID); err != nil {
		t.Fatalf("pause with room: %v", err)
	}
	if err := e.m.Delete(ctx, tn, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.checkClean()
}

// TestOnTimeoutPauseFails: an expired on_timeout=pause sandbox whose checkpoint fails for a
// full disk runs on, a sandbox.pause_failed event says so, and its expiry moves pauseRetry on.
func TestOnTimeoutPauseFails(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	const tn = "acme"
	sb, err := e.m.Create(ctx, tn, CreateRequest{OnTimeout: "pause"})
	if err != nil {
		t.Fatal(err)
	}
	e.drv.OnPause = func(_ context.Context, op fake.Op, id string) error {
		if op == fake.OpCheckpoint && id == sb.ID {
			return fmt.Errorf("write checkpoint: %w", syscall.ENOSPC)
		}
		return nil
	}
	sub := e.m.Subscribe(tn)
	defer sub.Close()
	e.m.Start()
	e.advance(time.Hour)
	expired := e.now()
	var ev Event
	select {
	case ev = <-sub.C:
	case <-time.After(10 * time.Second):
		t.Fatal("no event after the expiry")
	}
	if ev.Type != EventPauseFailed || ev.SandboxID != sb.ID {
		t.Fatalf("event %+v, want %s of %s", ev, EventPauseFailed, sb.ID)
	}
	info, err := e.m.Get(ctx, tn, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != StateRunning {
		t.Errorf("state %s, want running", info.State)
	}
	if d := info.ExpiresAt.Sub(expired); d < pauseRetry-5*time.Second || d > pauseRetry+5*time.Second {
		t.Errorf("expires %s after the failed pause, want about %s", d, pauseRetry)
	}
	if st, _ := e.drv.State(ctx, sb.ID); st != runtime.StateRunning {
		t.Errorf("runtime %s, want running", st)
	}
	if e.hasCheckpointDir(sb.ID) {
		t.Error("the failed pause left a checkpoint")
	}
	// The next try, once the disk has room, pauses it.
	e.drv.OnPause = nil
	e.advance(pauseRetry + time.Second)
	e.waitState(tn, sb.ID, StatePaused)
	e.m.Close()
	if err := e.m.Delete(ctx, tn, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.checkClean()
}

// TestSlowSandboxDoesNotStallOthers: while the expiry pause of one sandbox hangs in its
// checkpoint, another expired sandbox is removed.
func TestSlowSandboxDoesNotStallOthers(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	const tn = "acme"
	slow, err := e.m.Create(ctx, tn, CreateRequest{OnTimeout: "pause"})
	if err != nil {
		t.Fatal(err)
	}
	bl := newBlocker(slow.ID)
	t.Cleanup(bl.open)
	e.drv.OnPause = bl.hook
	e.m.Start()
	e.advance(time.Hour)
	bl.waitEntered(t)
	other := e.create(tn) // created after the clock moved: expires in DefaultTimeout
	e.advance(time.Hour)
	e.waitState(tn, other.ID, StateDeleted)
	if s := e.state(tn, slow.ID); s != StatePausing {
		t.Errorf("slow sandbox is %s while its pause hangs, want pausing", s)
	}
	bl.open()
	e.waitState(tn, slow.ID, StatePaused)
	e.m.Close()
	if err := e.m.Delete(ctx, tn, slow.ID); err != nil {
		t.Fatal(err)
	}
	e.checkClean()
}

// TestDeleteWaitsForLongOperation: a delete issued while a pause or a full snapshot holds the
// sandbox waits for it and then succeeds, even when the caller's deadline passed meanwhile (its
// own time limit starts once it has the sandbox).
func TestDeleteWaitsForLongOperation(t *testing.T) {
	for _, tt := range []struct {
		name string
		op   func(e *testEnv, id string) error
	}{
		{"pause", func(e *testEnv, id string) error { _, err := e.m.Pause(context.Background(), "acme", id); return err }},
		{"full snapshot", func(e *testEnv, id string) error {
			_, err := e.m.Snapshot(context.Background(), "acme", id, snapshot.Request{Kind: snapshot.KindFull})
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t)
			sb := e.create("acme")
			bl := newBlocker(sb.ID)
			t.Cleanup(bl.open)
			e.drv.OnPause = bl.hook
			opErr := make(chan error, 1)
			go func() { opErr <- tt.op(e, sb.ID) }()
			bl.waitEntered(t)
			delErr := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				delErr <- e.m.Delete(ctx, "acme", sb.ID)
			}()
			select {
			case err := <-delErr:
				t.Fatalf("delete returned while the %s held the sandbox: %v", tt.name, err)
			case <-time.After(500 * time.Millisecond):
			}
			bl.open()
			if err := <-opErr; err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			select {
			case err := <-delErr:
				if err != nil {
					t.Fatalf("delete after the %s: %v", tt.name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("delete did not finish after the operation ended")
			}
			if s := e.state("acme", sb.ID); s != StateDeleted {
				t.Errorf("sandbox is %s", s)
			}
			if e.hasCheckpointDir(sb.ID) {
				t.Error("checkpoint left after delete")
			}
			e.checkClean()
		})
	}
}

// TestCloseWithinGrace: Close returns within its grace while a background job (an expiry
// pause) hangs; the job finishes afterwards.
func TestCloseWithinGrace(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	sb, err := e.m.Create(ctx, "acme", CreateRequest{OnTimeout: "pause"})
	if err != nil {
		t.Fatal(err)
	}
	bl := newBlocker(sb.ID)
	t.Cleanup(bl.open)
	e.drv.OnPause = bl.hook
	e.m.Start()
	e.advance(time.Hour)
	bl.waitEntered(t)
	safety := time.AfterFunc(10*time.Second, bl.open) // a Close that waits fails the test, not hangs it
	defer safety.Stop()
	start := time.Now()
	e.m.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %s with a background job hanging, want about %s at most", d, closeGrace)
	}
	bl.open()
	e.waitState("acme", sb.ID, StatePaused)
	if err := e.m.Delete(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	e.checkClean()
}

// TestNoWarmSandboxAfterClose: a warm pool member whose template arrives after Close began is
// never started.
func TestNoWarmSandboxAfterClose(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e := newTestEnv(t, func(c *Config) {
		c.WarmPool = 1
		tpl := c.Templates
		c.Templates = func(_ context.Context, name string) (Template, error) {
			once.Do(func() { close(entered) })
			<-release // a slow build that does not watch its context
			return tpl(context.Background(), name)
		}
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	var mu sync.Mutex
	var started []string // every Create (and Restore) the fake is asked for
	e.drv.FailCreate = func(id string) bool {
		mu.Lock()
		started = append(started, id)
		mu.Unlock()
		return false
	}
	e.m.Start()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the warm pool did not ask for its template")
	}
	closed := make(chan struct{})
	go func() {
		e.m.Close()
		close(closed)
	}()
	time.Sleep(100 * time.Millisecond) // Close has begun
	close(release)
	<-closed
	time.Sleep(300 * time.Millisecond) // what a start after Close would take
	mu.Lock()
	if len(started) != 0 {
		t.Errorf("%d runtimes started after Close (first %s)", len(started), started[0])
	}
	mu.Unlock()
	e.checkClean()
}

// TestEgressTargetAfterCrash: once a sandbox's runtime died and a new sandbox took its slot,
// the egress lookup of that address finds the new sandbox, not the crashed one.
func TestEgressTargetAfterCrash(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.HealthInterval = 20 * time.Millisecond })
	ctx := context.Background()
	const tn = "acme"
	old := e.create(tn)
	addr := e.slotAddr(old.ID)
	if tg, ok := e.m.EgressTarget(addr); !ok || tg.SandboxID != old.ID {
		t.Fatalf("before the crash: %+v %v", tg, ok)
	}
	e.m.Start()
	e.drv.Kill(old.ID)
	e.waitState(tn, old.ID, StateError)
	e.m.mu.Lock()
	ob := e.m.boxes[old.ID]
	e.m.mu.Unlock()
	// The state is recorded first, then the runtime and slot go (crashed): once the box is
	// free again, its address must be gone.
	ob.mu.Lock()
	a := ob.slotAddr.Load()
	ob.mu.Unlock()
	if a != nil {
		t.Errorf("the crashed sandbox still shows the address %s", a)
	}
	nw := e.create(tn)
	if got := e.slotAddr(nw.ID); got != addr {
		t.Fatalf("the new sandbox has %s, not the crashed one's %s", got, addr)
	}
	if tg, ok := e.m.EgressTarget(addr); !ok || tg.SandboxID != nw.ID {
		t.Errorf("EgressTarget(%s) = %s (%v), want the new sandbox %s", addr, tg.SandboxID, ok, nw.ID)
	}
	e.m.Close()
	for _, id := range []string{old.ID, nw.ID} {
		if err := e.m.Delete(ctx, tn, id); err != nil {
			t.Fatal(err)
		}
	}
	e.checkClean()
}

// slotAddr is the guest address of sandbox id's slot.
func (e *testEnv) slotAddr(id string) netip.Addr {
	e.t.Helper()
	e.m.mu.Lock()
	b := e.m.boxes[id]
	e.m.mu.Unlock()
	if b == nil {
		e.t.Fatalf("no box %s", id)
	}
	a := b.slotAddr.Load()
	if a == nil {
		e.t.Fatalf("%s has no slot", id)
	}
	return *a
}

// TestPausedWithoutMarkFromAnEarlierVersion: a sandbox an earlier spaced paused (its checkpoint
// has no mark) is marked at start, so that a resume of it a crash interrupts still finds its
// checkpoint whole and it stays paused instead of being taken for lost.
func TestPausedWithoutMarkFromAnEarlierVersion(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	const tn = "acme"
	sb := e.create(tn)
	e.writeLayer(sb.ID, "f", "paused by an older spaced")
	if _, err := e.m.Pause(ctx, tn, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(e.m.checkpointMark(sb.ID)); err != nil { // as an older version left it
		t.Fatal(err)
	}
	e.restart()
	if !e.m.checkpointMarked(sb.ID) {
		t.Fatal("the checkpoint of an acknowledged pause was not marked at start")
	}
	// A resume that a crash cut off after it recorded resuming: still paused after the restart.
	e.setRecord(sb.ID, StateResuming)
	e.restart()
	if s := e.state(tn, sb.ID); s != StatePaused {
		t.Fatalf("after an interrupted resume: %s, want paused", s)
	}
	if _, err := e.m.Resume(ctx, tn, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.readLayer(tn, sb.ID, "f"); got != "paused by an older spaced" {
		t.Errorf("file after resume: %q", got)
	}
	if err := e.m.Delete(ctx, tn, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.checkClean()
}
