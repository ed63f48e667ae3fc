package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store"
)

var allStates = []State{StateCreating, StateRunning, StatePausing, StatePaused, StateResuming, StateDeleting, StateDeleted, StateError}

// allowed is the transition table as this test states it, independently of state.go.
var allowed = map[edge]bool{
	{StateCreating, StateRunning}: true, {StateCreating, StateDeleted}: true,
	{StateRunning, StatePausing}: true, {StateRunning, StateResuming}: true, {StateRunning, StateDeleting}: true, {StateRunning, StateError}: true,
	{StatePausing, StatePaused}: true, {StatePausing, StateRunning}: true, {StatePausing, StateResuming}: true, {StatePausing, StateError}: true,
	{StatePaused, StateResuming}: true, {StatePaused, StateDeleting}: true,
	{StateResuming, StateRunning}: true, {StateResuming, StatePaused}: true, {StateResuming, StateError}: true,
	{StateDeleting, StateDeleted}: true, {StateDeleting, StateError}: true,
	{StateError, StateDeleting}: true, {StateError, StateResuming}: true,
}

// TestGuardEveryPair: the guard allows exactly the table's edges, for every pair of states, and
// refuses the others as a conflict (409) through setState too, changing nothing.
func TestGuardEveryPair(t *testing.T) {
	if len(allStates) != len(transitions) {
		t.Fatalf("the test knows %d states, the table %d", len(allStates), len(transitions))
	}
	e := newTestEnv(t)
	ctx := context.Background()
	for _, from := range allStates {
		for _, to := range allStates {
			err := checkTransition(from, to)
			if want := allowed[edge{from, to}]; (err == nil) != want {
				t.Errorf("%s → %s: guard says %v, want allowed=%v", from, to, err, want)
			}
			if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("%s → %s: error class %v", from, to, err)
			}
			if allowed[edge{from, to}] {
				continue
			}
			// Through setState: refused before anything is written.
			b := newBox(e.m.newRecordForTest(from), Spec{})
			before := b.rec
			if err := e.m.setState(ctx, b, to, "x"); err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("setState %s → %s: %v", from, to, err)
			}
			if b.rec.State != before.State || b.rec.Error != before.Error || b.view.Load().State != from {
				t.Errorf("setState %s → %s changed the box", from, to)
			}
		}
	}
	if n := len(e.st.seen()); n != 0 {
		t.Errorf("refused transitions wrote %d state changes", n)
	}
}

func (m *Manager) newRecordForTest(st State) (rec store.Sandbox) {
	rec.ID, rec.Tenant, rec.State, rec.SlotIndex = newID("sbx_", 20), "t", string(st), -1
	return rec
}

// TestEveryTransitionTaken drives real operations (create, delete, crashes, restore from
// snapshots, restarts of spaced in the middle of pauses and resumes) and checks from what the
// store was told that every edge of the table was taken, and no other.
func TestEveryTransitionTaken(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	const tn = "acme"

	// creating → running; running → deleting → deleted.
	a := e.create(tn)
	if err := e.m.Delete(ctx, tn, a.ID); err != nil {
		t.Fatal(err)
	}
	// creating → deleted: a create whose runtime fails.
	e.drv.FailCreate = func(string) bool { return true }
	if _, err := e.m.Create(ctx, tn, CreateRequest{}); err == nil {
		t.Fatal("create on a failing runtime succeeded")
	}
	e.drv.FailCreate = nil

	// running → error (its runtime died; a command finds out); error → deleting; deleting →
	// error (the slot does not go back); error → deleting → deleted.
	c := e.create(tn)
	e.drv.Kill(c.ID)
	if _, err := e.m.Exec(ctx, tn, c.ID, ExecOptions{Argv: []string{"true"}}); err == nil {
		t.Log("exec on a dead runtime started") // the agent is gone: Start fails or the stream breaks
	}
	if err := e.m.probe(tn, c.ID); err == nil || e.state(tn, c.ID) != StateError {
		t.Fatalf("after its runtime died: probe %v, state %s", err, e.state(tn, c.ID))
	}
	d := e.create(tn)
	e.pool.SetFailRelease(true)
	if err := e.m.Delete(ctx, tn, d.ID); err == nil || e.state(tn, d.ID) != StateError {
		t.Fatalf("delete with a failing slot pool: %v, state %s", err, e.state(tn, d.ID))
	}
	e.pool.SetFailRelease(false)
	for _, id := range []string{c.ID, d.ID} {
		if err := e.m.Delete(ctx, tn, id); err != nil {
			t.Fatalf("delete %s from error: %v", id, err)
		}
	}

	// running → resuming → running: a whole restore from a filesystem snapshot; resuming →
	// error: one whose new runtime does not start; error → resuming → running: restored again.
	r := e.create(tn)
	sid := e.snapshotOfFiles(r, snapshot.KindFilesystem, map[string]string{"f": "from the snapshot"})
	if _, err := e.m.Restore(ctx, tn, r.ID, sid, nil); err != nil {
		t.Fatalf("restore: %v", err)
	}
	e.drv.FailCreate = func(string) bool { return true }
	if _, err := e.m.Restore(ctx, tn, r.ID, sid, nil); err == nil || e.state(tn, r.ID) != StateError {
		t.Fatalf("restore on a failing runtime: %v, state %s", err, e.state(tn, r.ID))
	}
	e.drv.FailCreate = nil
	if _, err := e.m.Restore(ctx, tn, r.ID, sid, nil); err != nil || e.state(tn, r.ID) != StateRunning {
		t.Fatalf("restore from error: %v, state %s", err, e.state(tn, r.ID))
	}

	// running → pausing → paused; paused → resuming → running; resuming → paused: a resume
	// whose restore fails goes back to paused; paused → deleting.
	q := e.create(tn)
	if _, err := e.m.Pause(ctx, tn, q.ID); err != nil || e.state(tn, q.ID) != StatePaused {
		t.Fatalf("pause: %v, state %s", err, e.state(tn, q.ID))
	}
	if _, err := e.m.Resume(ctx, tn, q.ID); err != nil || e.state(tn, q.ID) != StateRunning {
		t.Fatalf("resume: %v, state %s", err, e.state(tn, q.ID))
	}
	if _, err := e.m.Pause(ctx, tn, q.ID); err != nil {
		t.Fatal(err)
	}
	e.drv.FailCreate = func(string) bool { return true }
	if _, err := e.m.Resume(ctx, tn, q.ID); err == nil || e.state(tn, q.ID) != StatePaused {
		t.Fatalf("resume on a failing runtime: %v, state %s", err, e.state(tn, q.ID))
	}
	e.drv.FailCreate = nil
	if err := e.m.Delete(ctx, tn, q.ID); err != nil {
		t.Fatalf("delete of a paused sandbox: %v", err)
	}

	// Restarts of spaced in the middle of pauses and resumes.
	p1, p2, p3, p4, p5, p6 := e.create(tn), e.create(tn), e.create(tn), e.create(tn), e.create(tn), e.create(tn)
	e.setRecord(p1.ID, StatePausing) // runtime still running → running
	e.setRecord(p2.ID, StateResuming)
	e.crashInPause(p3.ID, true) // runtime stopped at a marked checkpoint → paused
	// A resume that had not restored yet: marked checkpoint, no runtime → paused.
	if _, err := e.m.Pause(ctx, tn, p4.ID); err != nil {
		t.Fatal(err)
	}
	e.setRecord(p4.ID, StateResuming)
	e.setRecord(p5.ID, StatePausing) // runtime gone, nothing to come back from → error
	e.drv.Kill(p5.ID)
	// Runtime gone, a full snapshot → resuming → running from the snapshot.
	if _, err := e.m.Snapshot(ctx, tn, p6.ID, snapshot.Request{Kind: snapshot.KindFull}); err != nil {
		t.Fatalf("full snapshot: %v", err)
	}
	e.setRecord(p6.ID, StatePausing)
	e.drv.Kill(p6.ID)
	e.restart()
	for _, tt := range []struct {
		id   string
		want State
	}{{p1.ID, StateRunning}, {p2.ID, StateRunning}, {p3.ID, StatePaused}, {p4.ID, StatePaused}, {p5.ID, StateError}, {p6.ID, StateRunning}} {
		if got := e.state(tn, tt.id); got != tt.want {
			t.Errorf("after restart %s is %s, want %s", tt.id, got, tt.want)
		}
	}
	// A paused sandbox a restart found resumes; another is restored from a snapshot
	// (paused → resuming → running).
	if _, err := e.m.Resume(ctx, tn, p3.ID); err != nil || e.state(tn, p3.ID) != StateRunning {
		t.Fatalf("resume after restart: %v, state %s", err, e.state(tn, p3.ID))
	}
	if _, err := e.m.Restore(ctx, tn, p4.ID, sid, nil); err != nil || e.state(tn, p4.ID) != StateRunning {
		t.Fatalf("restore of a paused sandbox: %v, state %s", err, e.state(tn, p4.ID))
	}

	seen := e.st.seen()
	for ed := range allowed {
		if seen[ed] == 0 {
			t.Errorf("no operation took %s → %s", ed.from, ed.to)
		}
	}
	var taken []string
	for ed, n := range seen {
		if !allowed[ed] {
			t.Errorf("the store was told %s → %s, which the table does not allow", ed.from, ed.to)
		}
		taken = append(taken, fmt.Sprintf("%s→%s ×%d", ed.from, ed.to, n))
	}
	sort.Strings(taken)
	t.Logf("taken: %s", strings.Join(taken, ", "))

	for _, id := range []string{p1.ID, p2.ID, p3.ID, p4.ID, p5.ID, p6.ID, r.ID} {
		if err := e.m.Delete(ctx, tn, id); err != nil {
			t.Fatal(err)
		}
	}
	e.checkClean()
}

// TestIllegalOperations: operations a sandbox's state (or the driver) does not allow are
// refused with the error the API maps, and change nothing.
func TestIllegalOperations(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	const tn = "acme"
	running := e.create(tn)
	paused := e.create(tn)
	if _, err := e.m.Pause(ctx, tn, paused.ID); err != nil {
		t.Fatal(err)
	}
	broken := e.create(tn)
	e.setRecord(broken.ID, StateError)
	gone := e.create(tn)
	// On a runtime without a checkpointer or a layer capturer: a running sandbox, and one whose
	// record says paused (as after a change of configuration).
	bare, err := e.m.Create(ctx, tn, CreateRequest{Runtime: "bare"})
	if err != nil {
		t.Fatal(err)
	}
	barePaused, err := e.m.Create(ctx, tn, CreateRequest{Runtime: "bare"})
	if err != nil {
		t.Fatal(err)
	}
	e.setRecord(barePaused.ID, StatePaused)
	if err := e.bare.Delete(ctx, barePaused.ID); err != nil {
		t.Fatal(err)
	}
	e.restart()
	if err := e.m.Delete(ctx, tn, gone.ID); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []Info{paused, barePaused} {
		if s := e.state(tn, sb.ID); s != StatePaused {
			t.Fatalf("setup: %s is %s", sb.ID, s)
		}
	}
	sid := e.snapshotOfFiles(running, snapshot.KindFilesystem, nil)
	tests := []struct {
		name string
		id   string
		op   func(id string) error
		want error
	}{
		{"pause of a paused sandbox", paused.ID, func(id string) error { _, err := e.m.Pause(ctx, tn, id); return err }, errdefs.ErrFailedPrecondition},
		{"resume of a running sandbox", running.ID, func(id string) error { _, err := e.m.Resume(ctx, tn, id); return err }, errdefs.ErrFailedPrecondition},
		{"resume of a sandbox in error", broken.ID, func(id string) error { _, err := e.m.Resume(ctx, tn, id); return err }, errdefs.ErrFailedPrecondition},
		{"pause of a sandbox in error", broken.ID, func(id string) error { _, err := e.m.Pause(ctx, tn, id); return err }, errdefs.ErrFailedPrecondition},
		{"exec on a deleted sandbox", gone.ID, func(id string) error {
			_, err := e.m.Exec(ctx, tn, id, ExecOptions{Argv: []string{"true"}})
			return err
		}, errdefs.ErrNotFound},
		{"exec on a sandbox in error", broken.ID, func(id string) error {
			_, err := e.m.Exec(ctx, tn, id, ExecOptions{Argv: []string{"true"}})
			return err
		}, errdefs.ErrFailedPrecondition},
		{"pause of a deleted sandbox", gone.ID, func(id string) error { _, err := e.m.Pause(ctx, tn, id); return err }, errdefs.ErrNotFound},
		{"delete of a deleted sandbox", gone.ID, func(id string) error { return e.m.Delete(ctx, tn, id) }, errdefs.ErrNotFound},
		{"fork of a sandbox in error", broken.ID, func(id string) error { _, err := e.m.Fork(ctx, tn, id, 1); return err }, errdefs.ErrFailedPrecondition},
		{"timeout of a paused sandbox", paused.ID, func(id string) error { _, err := e.m.SetTimeout(ctx, tn, id, 60); return err }, errdefs.ErrFailedPrecondition},
		{"snapshot of a sandbox in error", broken.ID, func(id string) error { _, err := e.m.Snapshot(ctx, tn, id, snapshot.Request{}); return err }, errdefs.ErrFailedPrecondition},
		{"restore of a deleted sandbox", gone.ID, func(id string) error { _, err := e.m.Restore(ctx, tn, id, sid, nil); return err }, errdefs.ErrNotFound},
		{"another tenant's pause", running.ID, func(id string) error { _, err := e.m.Pause(ctx, "other", id); return err }, errdefs.ErrNotFound},
		// What needs a checkpoint or a look at the files is refused on a driver without them.
		{"pause without a checkpointer", bare.ID, func(id string) error { _, err := e.m.Pause(ctx, tn, id); return err }, errdefs.ErrFailedPrecondition},
		{"resume without a checkpointer", barePaused.ID, func(id string) error { _, err := e.m.Resume(ctx, tn, id); return err }, errdefs.ErrFailedPrecondition},
		{"exec on a paused sandbox without a checkpointer", barePaused.ID, func(id string) error {
			_, err := e.m.Exec(ctx, tn, id, ExecOptions{Argv: []string{"true"}})
			return err
		}, errdefs.ErrFailedPrecondition},
		{"fork without a checkpointer", bare.ID, func(id string) error { _, err := e.m.Fork(ctx, tn, id, 1); return err }, errdefs.ErrFailedPrecondition},
		{"file snapshot without a layer capturer", bare.ID, func(id string) error { _, err := e.m.Snapshot(ctx, tn, id, snapshot.Request{}); return err }, errdefs.ErrFailedPrecondition},
		{"full snapshot without a checkpointer", bare.ID, func(id string) error {
			_, err := e.m.Snapshot(ctx, tn, id, snapshot.Request{Kind: snapshot.KindFull})
			return err
		}, errdefs.ErrFailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.state(tn, tt.id)
			edges := len(e.st.seen())
			err := tt.op(tt.id)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if after := e.state(tn, tt.id); after != before {
				t.Errorf("state %s → %s", before, after)
			}
			if n := len(e.st.seen()); n != edges {
				t.Errorf("a refused operation changed a state (%d → %d kinds of change)", edges, n)
			}
		})
	}
	for _, id := range []string{running.ID, paused.ID, broken.ID, bare.ID, barePaused.ID} {
		if err := e.m.Delete(ctx, tn, id); err != nil {
			t.Fatal(err)
		}
	}
	e.checkClean()
}

// TestConcurrentOperations: pause, exec, fork, snapshot and delete race on one sandbox. Each
// either works or fails cleanly; the sandbox ends deleted and nothing of it is left in the
// driver, the slot pool or the store.
func TestConcurrentOperations(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	const tn = "acme"
	for round := range 5 {
		sb := e.create(tn)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		op := func(name string, f func() error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) && !errors.Is(err, errdefs.ErrNotFound) &&
					!errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, context.Canceled) {
					errs <- fmt.Errorf("round %d %s: %w", round, name, err)
				}
			}()
		}
		for range 3 {
			op("exec", func() error {
				ex, err := e.m.Exec(ctx, tn, sb.ID, ExecOptions{Argv: []string{"true"}})
				if err != nil {
					return err
				}
				defer ex.Close()
				for {
					if _, err := ex.Next(); err != nil {
						if errors.Is(err, io.EOF) {
							return nil
						}
						return err
					}
				}
			})
			op("pause", func() error { _, err := e.m.Pause(ctx, tn, sb.ID); return err })
			op("fork", func() error {
				copies, err := e.m.Fork(ctx, tn, sb.ID, 2)
				for _, c := range copies {
					if derr := e.m.Delete(ctx, tn, c.ID); derr != nil {
						return fmt.Errorf("delete copy %s: %w", c.ID, derr)
					}
				}
				return err
			})
			op("snapshot", func() error { _, err := e.m.Snapshot(ctx, tn, sb.ID, snapshot.Request{}); return err })
			op("get", func() error { _, err := e.m.Get(ctx, tn, sb.ID); return err })
		}
		op("delete", func() error { return e.m.Delete(ctx, tn, sb.ID) })
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if err := e.m.Delete(ctx, tn, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("round %d: final delete: %v", round, err)
		}
		if s := e.state(tn, sb.ID); s != StateDeleted {
			t.Fatalf("round %d: sandbox is %s", round, s)
		}
	}
	for ed := range e.st.seen() {
		if !allowed[ed] {
			t.Errorf("the store was told %s → %s", ed.from, ed.to)
		}
	}
	e.checkClean()
}
