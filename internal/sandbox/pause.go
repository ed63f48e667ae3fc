package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// Event types of pause and resume.
const (
	EventPaused  = "sandbox.paused"
	EventResumed = "sandbox.resumed"
)

// checkpointDir is where a paused sandbox's state lives.
func (m *Manager) checkpointDir(id string) string {
	return filepath.Join(m.cfg.StateDir, "checkpoints", id)
}

// checkpointMark is the file that says a sandbox's checkpoint is whole: written (durably) after
// the driver's Checkpoint returned and the directory reached the disk, before the runtime is
// stopped; removed before a new checkpoint is begun and with the checkpoint. Recovery trusts
// only a marked checkpoint as a finished pause.
func (m *Manager) checkpointMark(id string) string {
	return filepath.Join(m.cfg.StateDir, "checkpoints", id+".done")
}

// checkpointMarked reports whether id's checkpoint is whole.
func (m *Manager) checkpointMarked(id string) bool {
	//confine:host spaced's own marker file beside the checkpoint
	_, err := os.Lstat(m.checkpointMark(id))
	return err == nil
}

// removeCheckpoint removes id's checkpoint, marker first: a crash in between leaves an
// unmarked directory, which nothing takes for a pause.
func (m *Manager) removeCheckpoint(id string) error {
	if err := os.Remove(m.checkpointMark(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.RemoveAll(m.checkpointDir(id))
}

// markCheckpoint records that id's checkpoint is whole.
func (m *Manager) markCheckpoint(id string) error {
	mark := m.checkpointMark(id)
	//confine:host spaced's own marker file beside the checkpoint
	f, err := os.OpenFile(mark, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return err
	}
	return durable.Sync(filepath.Dir(mark))
}

func (m *Manager) checkpointer(b *box) (runtime.Checkpointer, error) {
	cp, ok := m.cfg.Drivers[b.rec.Runtime].(runtime.Checkpointer)
	if !ok || m.cfg.StateDir == "" {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("runtime %s cannot pause sandboxes", b.rec.Runtime))
	}
	return cp, nil
}

// Pause saves a running sandbox's whole state (memory, processes, files) to disk and stops its
// runtime: it then holds no CPU or memory. Its slot, token and remaining time are kept; time
// paused does not count against its timeout.
func (m *Manager) Pause(ctx context.Context, tenant, id string) (Info, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.rec.State) == StatePaused {
		return Info{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is already paused", id))
	}
	cp, err := m.checkpointer(b)
	if err != nil {
		return Info{}, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	if State(b.rec.State) == StateRunning {
		if err := m.roomForCheckpoint(ctx, b, "pause"); err != nil {
			return Info{}, err
		}
	}
	if err := m.setState(ctx, b, StatePausing, ""); err != nil {
		return Info{}, err
	}
	m.crash(crashpoint.PausePausing)
	dir := m.checkpointDir(id)
	if err := m.removeCheckpoint(id); err != nil {
		_ = m.setState(ctx, b, StateRunning, "")
		return Info{}, fmt.Errorf("pause %s: remove an old checkpoint: %w", id, err)
	}
	//confine:host spaced's state directory
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		_ = m.setState(ctx, b, StateRunning, "")
		return Info{}, err
	}
	if err := cp.Checkpoint(ctx, id, dir, runtime.CheckpointOptions{Durable: true}); err != nil {
		_ = m.removeCheckpoint(id)
		err = errdefs.NoSpace(err)
		// A failed checkpoint may have stopped the runtime; if so the sandbox comes back from
		// its latest full snapshot, or is lost.
		if st, serr := m.cfg.Drivers[b.rec.Runtime].State(ctx, id); serr == nil && st == runtime.StateRunning {
			_ = m.setState(ctx, b, StateRunning, "")
			return Info{}, fmt.Errorf("pause %s: %w", id, err)
		}
		if !m.recoverFromSnapshot(ctx, b, "pause failed: "+err.Error()) {
			m.crashed(ctx, b, "pause failed: "+err.Error())
		}
		return Info{}, fmt.Errorf("pause %s: %w", id, err)
	}
	// The driver made dir's contents durable; its entry in checkpoints/ too.
	if err := durable.Sync(filepath.Dir(dir)); err != nil {
		m.crashed(ctx, b, "pause: checkpoint not durable: "+err.Error())
		return Info{}, fmt.Errorf("pause %s: make the checkpoint durable: %w", id, err)
	}
	m.crash(crashpoint.PauseCheckpoint)
	if err := m.markCheckpoint(id); err != nil {
		m.crashed(ctx, b, "pause: checkpoint could not be marked whole: "+err.Error())
		return Info{}, fmt.Errorf("pause %s: mark the checkpoint: %w", id, err)
	}
	m.crash(crashpoint.PauseMarked)
	// The runtime's own state goes; the checkpoint holds everything. The slot goes too: runsc
	// took its addresses over, and a restore takes whatever slot it is given (the sandbox's own
	// view of its network does not depend on it).
	m.stopRuntime(ctx, b, "paused")
	m.crash(crashpoint.PauseStopped)
	b.rec.TimeoutSeconds = max(1, int(time.Until(b.rec.ExpiresAt).Round(time.Second)/time.Second))
	b.rec.ExpiresAt = time.Time{}
	if err := m.setState(ctx, b, StatePaused, ""); err != nil {
		_ = m.setState(ctx, b, StateError, "pause could not be recorded: "+err.Error())
		return Info{}, err
	}
	m.publish(EventPaused, b.rec, "")
	m.log.Info("sandbox paused", "id", id)
	return *b.view.Load(), nil
}

// Resume brings a paused sandbox back where it was: same processes (same PIDs), files, memory,
// token and address.
func (m *Manager) Resume(ctx context.Context, tenant, id string) (Info, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.rec.State) != StatePaused {
		return Info{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s, not paused", id, b.rec.State))
	}
	if err := m.resume(ctx, b); err != nil {
		return Info{}, err
	}
	return *b.view.Load(), nil
}

// resume restores b. The caller holds b.mu and has checked that b is paused.
func (m *Manager) resume(ctx context.Context, b *box) error {
	cp, err := m.checkpointer(b)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	// Exactly the layers it was started on: its writable layer and memory belong to them.
	tpl := Template{RootFS: b.spec.RootFS, Layers: b.spec.Layers}
	if tpl.RootFS == "" {
		var err error
		if tpl, err = m.cfg.Templates(ctx, b.rec.Template); err != nil {
			return fmt.Errorf("resume %s: template: %w", b.rec.ID, err)
		}
	}
	if b.slot == nil {
		slot, err := m.cfg.Slots.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("resume %s: network slot: %w", b.rec.ID, err)
		}
		b.slot, b.rec.SlotIndex = slot, slot.Index
	}
	if err := m.setState(ctx, b, StateResuming, ""); err != nil { // records the slot too
		return err
	}
	m.crash(crashpoint.ResumeResuming)
	spec := m.runtimeSpec(b, tpl)
	if err := cp.Restore(ctx, spec, m.checkpointDir(b.rec.ID)); err != nil {
		if rerr := m.cfg.Slots.Release(ctx, b.slot); rerr == nil {
			b.slot, b.rec.SlotIndex = nil, -1
		}
		_ = m.setState(ctx, b, StatePaused, "")
		return fmt.Errorf("resume %s: %w", b.rec.ID, err)
	}
	m.setClient(b)
	rctx, rcancel := context.WithTimeout(ctx, m.cfg.ReadyTimeout)
	defer rcancel()
	if err := m.waitReady(rctx, b.rec.Runtime, b.rec.ID, b.client); err != nil {
		// Back to paused: the checkpoint is intact, a later resume may do better.
		m.unresume(ctx, b)
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s did not come back: %v", b.rec.ID, err))
	}
	m.crash(crashpoint.ResumeRestored)
	b.rec.ExpiresAt = m.cfg.Now().UTC().Add(time.Duration(max(b.rec.TimeoutSeconds, 1)) * time.Second)
	if err := m.setState(ctx, b, StateRunning, ""); err != nil {
		m.crashed(ctx, b, "resume could not be recorded: "+err.Error())
		return err
	}
	m.crash(crashpoint.ResumeRunning)
	if err := m.removeCheckpoint(b.rec.ID); err != nil {
		m.log.Warn("remove used checkpoint", "id", b.rec.ID, "err", err)
	}
	m.publish(EventResumed, b.rec, "")
	m.log.Info("sandbox resumed", "id", b.rec.ID)
	return nil
}

// unresume stops a restored runtime again and returns b to paused, keeping its checkpoint. The
// caller holds b.mu.
func (m *Manager) unresume(ctx context.Context, b *box) {
	m.stopRuntime(ctx, b, "paused")
	// From resuming (a failed resume) or pausing (a pause a restart interrupted): the
	// checkpoint rules.
	if err := m.setState(ctx, b, StatePaused, ""); err != nil {
		m.log.Error("record paused", "id", b.rec.ID, "err", err)
	}
}

// waitReady waits for a sandbox's agent to answer, as agent.Client.WaitReady does, but gives up
// as soon as the runtime is seen to have stopped (a restore from a checkpoint cut short may start
// and die at once): then there is nothing to wait for.
func (m *Manager) waitReady(ctx context.Context, runtimeName, id string, c *agent.Client) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	drv := m.cfg.Drivers[runtimeName]
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if st, err := drv.State(ctx, id); err == nil && st != runtime.StateRunning && st != runtime.StatePaused {
				cancel(fmt.Errorf("its runtime is %s", st))
				return
			}
		}
	}()
	err := c.WaitReady(ctx)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return err
}
