package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/store"
)

// Recover re-adopts the sandboxes of an earlier spaced on the same home: running ones are taken
// over untouched, ones caught half-created or half-deleted are finished off, ones whose runtime
// died are marked crashed, and runtime state no record knows of is removed. Call it once, before
// serving.
func (m *Manager) Recover(ctx context.Context) error {
	recs, err := m.cfg.Store.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return fmt.Errorf("recover: list sandboxes: %w", err)
	}
	if err := m.reconcileSnapshots(ctx); err != nil {
		return fmt.Errorf("recover: snapshots: %w", err)
	}
	known := map[string]bool{}
	slots := map[int]bool{}
	for _, rec := range recs {
		known[rec.ID] = true
		if rec.Tenant != warmTenant && rec.State != string(StateCreating) && rec.State != string(StateDeleting) && rec.State != string(StateError) {
			slots[rec.SlotIndex] = true
		}
		spec, err := decodeSpec(rec.Spec)
		if err != nil {
			return err
		}
		m.adopt(ctx, newBox(rec, spec))
		m.crash(crashpoint.RecoverAdopting)
	}
	// Slots that no surviving sandbox holds (an earlier run died between taking a slot and
	// recording it) go back.
	for _, idx := range m.cfg.Slots.InUse() {
		if slots[idx] {
			continue
		}
		if s, err := m.cfg.Slots.Adopt(ctx, idx); err == nil {
			m.log.Warn("releasing a network slot no sandbox holds", "slot", idx)
			if err := m.cfg.Slots.Release(ctx, s); err != nil {
				m.log.Error("release slot", "slot", idx, "err", err)
			}
		}
	}
	for name, drv := range m.cfg.Drivers {
		ids, err := drv.List(ctx)
		if err != nil {
			return fmt.Errorf("recover: list %s sandboxes: %w", name, err)
		}
		for _, id := range ids {
			if !known[id] {
				m.log.Warn("removing runtime state with no record", "runtime", name, "id", id)
				if err := drv.Delete(ctx, id); err != nil {
					m.log.Error("remove orphan", "id", id, "err", err)
				}
			}
		}
	}
	m.gcLayers(ctx)
	m.sweepScratch()
	m.reconcileTemplateRefs(ctx)
	return nil
}

// sweepScratch removes what interrupted forks, restores and full snapshots left in the scratch
// directories: nothing uses them before serving starts.
func (m *Manager) sweepScratch() {
	if m.cfg.StateDir == "" {
		return
	}
	for _, sub := range []string{"forks", "work"} {
		dir := filepath.Join(m.cfg.StateDir, sub)
		//confine:host spaced's own scratch directory (its entries are removed, not read)
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			m.log.Info("removing scratch an interrupted operation left", "path", filepath.Join(dir, e.Name()))
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				m.log.Error("remove scratch", "path", filepath.Join(dir, e.Name()), "err", err)
			}
		}
	}
}

// adopt takes over one recorded sandbox.
func (m *Manager) adopt(ctx context.Context, b *box) {
	drv, ok := m.cfg.Drivers[b.rec.Runtime]
	if !ok {
		m.log.Error("sandbox of an unconfigured runtime; leaving it alone", "id", b.rec.ID, "runtime", b.rec.Runtime)
		return
	}
	if b.rec.SlotIndex >= 0 && State(b.rec.State) != StateError {
		if s, err := m.cfg.Slots.Adopt(ctx, b.rec.SlotIndex); err == nil {
			b.slot = s
			b.refresh()
		} else {
			m.log.Warn("network slot gone", "id", b.rec.ID, "slot", b.rec.SlotIndex, "err", err)
		}
	}
	state := State(b.rec.State)
	if b.rec.Tenant == warmTenant {
		state = StateDeleting // a warm pool member of an earlier run: remove it
	}
	switch state {
	case StateCreating, StateDeleting:
		m.log.Info("finishing interrupted operation", "id", b.rec.ID, "state", state)
		if s := State(b.rec.State); s != StateCreating && s != StateDeleting { // a warm pool member
			if err := m.setState(ctx, b, StateDeleting, ""); err != nil {
				m.log.Error("record deleting", "id", b.rec.ID, "err", err)
			}
		}
		_ = m.teardown(ctx, b)
		if err := m.setState(ctx, b, StateDeleted, ""); err != nil {
			m.log.Error("remove record", "id", b.rec.ID, "err", err)
		}
		return
	case StateError:
		m.register(b)
		return
	case StatePaused:
		// Its checkpoint is on disk; it resumes when asked or used. A pause acknowledged by a
		// spaced from before checkpoints were marked is marked now, so that a resume of it a
		// crash interrupts still finds it whole.
		if m.cfg.StateDir != "" && !m.checkpointMarked(b.rec.ID) && m.hasCheckpoint(b.rec.ID) {
			if err := m.markCheckpoint(b.rec.ID); err != nil {
				m.log.Error("mark the checkpoint of a paused sandbox", "id", b.rec.ID, "err", err)
			}
		}
		m.register(b)
		return
	}
	st, err := drv.State(ctx, b.rec.ID)
	if err == nil && st == runtime.StatePaused && b.slot != nil {
		// A crash in the middle of a file snapshot, a fork or a full snapshot left the runtime
		// frozen: the sandbox is intact, so it goes on (never torn down for it).
		if th, ok := drv.(runtime.Thawer); ok {
			if terr := th.Thaw(ctx, b.rec.ID); terr != nil {
				m.log.Error("thaw a sandbox left frozen", "id", b.rec.ID, "err", terr)
			} else {
				m.log.Info("resumed a sandbox an interrupted operation left frozen", "id", b.rec.ID)
				st = runtime.StateRunning
			}
		}
	}
	if err == nil && st == runtime.StateRunning && b.slot != nil {
		m.setClient(b)
		if state != StateRunning {
			// pausing/resuming were interrupted; the runtime runs, so the sandbox runs, and a
			// checkpoint it left (a resume that got as far as the restore) is stale.
			if err := m.setState(ctx, b, StateRunning, ""); err != nil {
				m.log.Error("persist adopted state", "id", b.rec.ID, "err", err)
			}
			if m.cfg.StateDir != "" {
				if err := m.removeCheckpoint(b.rec.ID); err != nil {
					m.log.Error("remove stale checkpoint", "id", b.rec.ID, "err", err)
				}
			}
		}
		m.register(b)
		m.log.Info("re-adopted sandbox", "id", b.rec.ID)
		return
	}
	m.register(b)
	b.mu.Lock()
	defer b.mu.Unlock()
	if (state == StatePausing || state == StateResuming) && m.cfg.StateDir != "" {
		switch {
		case m.checkpointMarked(b.rec.ID):
			// Caught mid-pause or mid-resume with a whole checkpoint: that is the sandbox.
			m.log.Info("interrupted pause or resume: sandbox is paused", "id", b.rec.ID)
			m.unresume(ctx, b)
			return
		case state == StatePausing && m.hasCheckpoint(b.rec.ID):
			// The runtime stopped at its checkpoint but the pause died before marking it: the
			// checkpoint may be whole or cut short. Try it; what does not come back is not
			// taken for a pause.
			if m.resumeUnmarked(ctx, b) {
				return
			}
		}
	}
	if m.recoverFromSnapshot(ctx, b, "runtime not running after restart") {
		return
	}
	// From running, pausing or resuming (recoverFromSnapshot leaves a failed recovery resuming).
	m.crashed(ctx, b, fmt.Sprintf("runtime not running after restart (state %s, err %v)", st, err))
}

// hasCheckpoint reports whether id has a (possibly partial) checkpoint directory.
func (m *Manager) hasCheckpoint(id string) bool {
	//confine:host the checkpoint directory itself (its top level is the driver's)
	entries, err := os.ReadDir(m.checkpointDir(id))
	return err == nil && len(entries) > 0
}

// resumeUnmarked tries to bring b back from a checkpoint an interrupted pause left unmarked. On
// success b runs again (same processes) and the checkpoint is gone; otherwise the checkpoint is
// removed, b is resuming and the caller goes on to recovery. The caller holds b.mu; b is pausing.
func (m *Manager) resumeUnmarked(ctx context.Context, b *box) bool {
	m.log.Info("interrupted pause left an unmarked checkpoint: trying it", "id", b.rec.ID)
	if b.slot != nil { // runsc held it; a restore gets a fresh one
		m.stopRuntime(ctx, b, "stopped")
	}
	err := m.resume(ctx, b)
	if err == nil {
		m.log.Info("the checkpoint of an interrupted pause was whole: sandbox resumed", "id", b.rec.ID)
		return true
	}
	m.log.Warn("the checkpoint of an interrupted pause does not restore", "id", b.rec.ID, "err", err)
	m.stopRuntime(ctx, b, "stopped")
	if rerr := m.removeCheckpoint(b.rec.ID); rerr != nil {
		m.log.Error("remove a checkpoint that does not restore", "id", b.rec.ID, "err", rerr)
	}
	// resume leaves a failed restore paused; what it stood on is gone now, so on to recovery.
	if State(b.rec.State) == StatePaused {
		if err := m.setState(ctx, b, StateResuming, "checkpoint of an interrupted pause does not restore"); err != nil {
			m.log.Error("record resuming", "id", b.rec.ID, "err", err)
		}
	}
	return false
}

func (m *Manager) register(b *box) {
	m.mu.Lock()
	m.boxes[b.rec.ID] = b
	m.mu.Unlock()
}
