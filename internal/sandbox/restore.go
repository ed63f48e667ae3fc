package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/fstree"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store"
)

// maxRestorePaths bounds one restore by paths.
const maxRestorePaths = 64

// Restore returns a sandbox to one of its tenant's snapshots. With paths, only those files or
// trees are put back, through the running sandbox's agent, and its processes keep running.
// Without, the whole sandbox is replaced: its files by the snapshot's, and for a full snapshot
// its processes and memory too (a filesystem snapshot starts fresh processes). The sandbox keeps
// its ID and token. If a whole restore fails after the old runtime was stopped, the sandbox is
// left in error and may be restored again.
func (m *Manager) Restore(ctx context.Context, tenant, id, sid string, paths []string) (Info, error) {
	if len(paths) > maxRestorePaths {
		return Info{}, errdefs.InvalidArgument(fmt.Sprintf("paths: at most %d", maxRestorePaths))
	}
	rel := make([]string, 0, len(paths))
	for _, p := range paths {
		r, err := fstree.CleanAbs(p)
		if err != nil {
			return Info{}, errdefs.InvalidArgument(err.Error())
		}
		rel = append(rel, r)
	}
	b, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	snap, err := m.snapshotOf(ctx, tenant, sid)
	if err != nil {
		return Info{}, err
	}
	mf, err := m.readManifest(snap.ID)
	if err != nil {
		return Info{}, err
	}
	b.mu.Lock() // waits its turn; the time limit starts when it has the sandbox
	defer b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
	defer cancel()
	if len(rel) > 0 {
		if State(b.rec.State) == StatePaused {
			if err := m.resume(ctx, b); err != nil {
				return Info{}, err
			}
		}
		if State(b.rec.State) != StateRunning {
			return Info{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s, not running", id, b.rec.State))
		}
		if err := m.restorePaths(ctx, b, mf, rel); err != nil {
			return Info{}, fmt.Errorf("restore %s from %s: %w", id, sid, err)
		}
		m.publish(EventRestored, b.rec, sid)
		m.log.Info("paths restored", "id", id, "snapshot", sid, "paths", paths)
		return *b.view.Load(), nil
	}
	switch State(b.rec.State) {
	case StateRunning, StatePaused, StateError:
	default:
		return Info{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s", id, b.rec.State))
	}
	if err := mf.CheckLayers(); err != nil {
		return Info{}, err
	}
	if err := m.setState(ctx, b, StateResuming, ""); err != nil {
		return Info{}, err
	}
	if err := m.bringUp(ctx, b, mf, snap.ID); err != nil {
		m.stopRuntime(ctx, b, "stopped")
		_ = m.setState(ctx, b, StateError, fmt.Sprintf("restore from %s failed: %v", sid, err))
		return Info{}, fmt.Errorf("restore %s from %s: %w", id, sid, err)
	}
	if b.rec.ExpiresAt.IsZero() {
		b.rec.ExpiresAt = m.cfg.Now().UTC().Add(time.Duration(max(b.rec.TimeoutSeconds, 1)) * time.Second)
	}
	if err := m.setState(ctx, b, StateRunning, ""); err != nil {
		return Info{}, err
	}
	m.publish(EventRestored, b.rec, sid)
	m.log.Info("sandbox restored", "id", id, "snapshot", sid, "kind", mf.Kind)
	return *b.view.Load(), nil
}

// restorePaths streams the snapshot's view of paths (its layer over its template) to the agent,
// which replaces them. The caller holds b.mu; b is running.
func (m *Manager) restorePaths(ctx context.Context, b *box, mf *snapshot.Manifest, rel []string) error {
	cs, err := m.chunkStore()
	if err != nil {
		return err
	}
	if err := mf.CheckLayers(); err != nil {
		return err
	}
	abs := make([]string, len(rel))
	for i, r := range rel {
		abs[i] = "/" + r
	}
	pr, pw := io.Pipe()
	go func() {
		m.crash(crashpoint.RestorePaths)
		pw.CloseWithError(cs.WriteTar(pw, mf, rel))
	}()
	err = b.client.RestoreTree(ctx, abs, pr)
	pr.CloseWithError(io.ErrClosedPipe)
	return err
}

// stopRuntime removes b's runtime and gives its slot back; streams to its agent end, saying
// the sandbox was (why: "paused", "stopped"). What fails is logged and returned. The caller
// holds b.mu.
func (m *Manager) stopRuntime(ctx context.Context, b *box, why string) error {
	var errs []error
	if b.end != nil {
		b.end(errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s %s", b.rec.ID, why)))
	}
	if drv, ok := m.cfg.Drivers[b.rec.Runtime]; ok {
		if err := drv.Delete(ctx, b.rec.ID); err != nil {
			m.log.Error("stop runtime", "id", b.rec.ID, "err", err)
			errs = append(errs, fmt.Errorf("delete runtime: %w", err))
		}
	}
	if b.hc != nil {
		b.hc.CloseIdleConnections()
	}
	b.client = nil
	if b.slot != nil {
		if err := m.cfg.Slots.Release(ctx, b.slot); err != nil {
			m.log.Error("release slot", "id", b.rec.ID, "err", err)
			errs = append(errs, fmt.Errorf("release slot: %w", err))
		} else {
			b.slot, b.rec.SlotIndex = nil, -1 // never claim a slot another sandbox may now hold
		}
	}
	b.refresh() // its address is no longer its own (egress lookups)
	return errors.Join(errs...)
}

// bringUp replaces whatever runs for b by the snapshot mf: the old runtime (and a paused
// sandbox's checkpoint) goes, a new one starts in a fresh slot on the snapshot's layers, and
// b's agent answers with b's token. The caller holds b.mu and records the state.
func (m *Manager) bringUp(ctx context.Context, b *box, mf *snapshot.Manifest, sid string) error {
	cs, err := m.chunkStore()
	if err != nil {
		return err
	}
	ms, err := decodeSpec(mf.Spec)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", sid, err)
	}
	drv := m.cfg.Drivers[b.rec.Runtime]
	if mf.Runtime != b.rec.Runtime {
		return errdefs.InvalidArgument(fmt.Sprintf("snapshot %s is of runtime %s, the sandbox runs %s", sid, mf.Runtime, b.rec.Runtime))
	}
	m.stopRuntime(ctx, b, "stopped")
	if err := m.removeCheckpoint(b.rec.ID); err != nil {
		return err
	}
	m.crash(crashpoint.RestoreWhole)
	work := filepath.Join(m.cfg.StateDir, "work", newID("restore_", 12))
	//confine:host spaced's state directories and layer directories by their own paths, not paths inside them
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := m.ensurePrivate(mf); err != nil {
		return fmt.Errorf("snapshot %s: %w", sid, err)
	}
	// The snapshot's files are one shared read-only layer (made once per snapshot); the sandbox
	// writes to a new empty layer above it.
	layer, unpin, err := m.snapshotLayer(sid, mf)
	if err != nil {
		return err
	}
	defer unpin()
	layers := withLayer(mf.Layers, layer)
	if mf.Checkpoint != nil {
		if err := cs.Materialize(*mf.Checkpoint, work); err != nil {
			return fmt.Errorf("snapshot %s: %w", sid, err)
		}
		if err := os.Mkdir(filepath.Join(work, "upper"), 0o755); err != nil {
			return err
		}
	}
	// It stands on the snapshot's template from now on (and lets go of its own).
	if err := m.holdTemplates(ctx, b.rec.ID, mf.RootFS, mf.Layers); err != nil {
		return err
	}
	if old := m.templatePaths(b.spec.RootFS, b.spec.Layers); len(old) > 0 {
		now := m.templatePaths(mf.RootFS, mf.Layers)
		var gone []string
		for _, p := range old {
			if !slices.Contains(now, p) {
				gone = append(gone, p)
			}
		}
		m.releaseTemplates(b.rec.ID, "", gone)
	}
	b.spec.RootFS, b.spec.Layers = mf.RootFS, layers
	b.spec.WorkingDir, b.spec.User, b.spec.Start = ms.WorkingDir, ms.User, ms.Start
	b.rec.Spec = encodeSpec(b.spec)
	slot, err := m.cfg.Slots.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("network slot: %w", err)
	}
	b.slot, b.rec.SlotIndex = slot, slot.Index
	b.refresh()
	if err := m.cfg.Store.UpdateSandbox(ctx, b.rec); err != nil {
		return err
	}
	tpl := Template{RootFS: mf.RootFS, Layers: layers}
	spec := m.runtimeSpec(b, tpl)
	token := b.rec.AccessToken
	if mf.Checkpoint != nil {
		cp, err := m.checkpointer(b)
		if err != nil {
			return err
		}
		if err := cp.Restore(ctx, spec, work); err != nil {
			return err
		}
		token = mf.AgentToken
	} else {
		if err := drv.Create(ctx, spec); err != nil {
			return err
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, m.cfg.ReadyTimeout)
	defer rcancel()
	old := agent.NewClient(m.cfg.AgentURL(slot), token, m.newHTTPClient())
	if err := old.WaitReady(rctx); err != nil {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox did not answer: %v", err))
	}
	if token != b.rec.AccessToken {
		// Memory of another sandbox (or of an earlier token): the agent gets this one's.
		if err := old.Rotate(rctx, b.rec.AccessToken); err != nil {
			return fmt.Errorf("give the agent its token: %w", err)
		}
	}
	m.setClient(b)
	if mf.Checkpoint == nil && ms.Start != nil {
		// Started afresh on the snapshot's files: so is the template's service (a code
		// interpreter finds its contexts in those files and says their kernels restarted).
		if err := m.startService(rctx, b, *ms.Start); err != nil {
			return err
		}
	}
	return nil
}

// ensurePrivate writes back, from the chunk store, any shared layer the snapshot stands on that
// is no longer on disk.
func (m *Manager) ensurePrivate(mf *snapshot.Manifest) error {
	cs, err := m.chunkStore()
	if err != nil {
		return err
	}
	for _, l := range mf.Layers {
		t, ok := mf.Private[l]
		if !ok {
			continue
		}
		//confine:host spaced's state directories and layer directories by their own paths, not paths inside them
		if _, err := os.Stat(l); err == nil {
			continue
		}
		unpin := m.pinLayer(l)
		defer unpin()
		tmp := filepath.Join(m.layersDir(), ".tmp-"+newID("", 12))
		if err := cs.WriteLayer(t, tmp, l); err != nil {
			return err
		}
		m.log.Info("shared layer written back from a snapshot", "layer", l)
	}
	return nil
}

// createFromSnapshot makes a new sandbox from one of tenant's snapshots: a running copy of a full
// snapshot's processes and files, or a sandbox started fresh on a filesystem snapshot's files.
// Fields the request sets (timeout, env, metadata, resources, network) apply over the snapshot's.
func (m *Manager) createFromSnapshot(ctx context.Context, tenant string, req CreateRequest) (Info, error) {
	snap, err := m.snapshotOf(ctx, tenant, req.FromSnapshot)
	if err != nil {
		return Info{}, err
	}
	mf, err := m.readManifest(snap.ID)
	if err != nil {
		return Info{}, err
	}
	if (req.Template != "" && req.Template != mf.Template) || (req.Runtime != "" && req.Runtime != mf.Runtime) {
		return Info{}, errdefs.InvalidArgument(fmt.Sprintf("from_snapshot: the snapshot is of template %s on %s; leave template and runtime out", mf.Template, mf.Runtime))
	}
	if err := mf.CheckLayers(); err != nil {
		return Info{}, err
	}
	ms, err := decodeSpec(mf.Spec)
	if err != nil {
		return Info{}, fmt.Errorf("snapshot %s: %w", snap.ID, err)
	}
	req.Template, req.Runtime, req.FromSnapshot = mf.Template, mf.Runtime, ""
	env := map[string]string{}
	for k, v := range mf.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	req.Env = env
	if req.Resources == (Resources{}) {
		req.Resources = ms.Resources
	}
	if req.Network == nil {
		n := ms.Network
		req.Network = &n
	}
	rec, spec, err := m.prepare(ctx, tenant, req)
	if err != nil {
		return Info{}, err
	}
	defer m.unreserve(tenant)
	spec.Parent = &Parent{SandboxID: mf.SandboxID, SnapshotID: snap.ID}
	spec.RootFS, spec.Layers, spec.WorkingDir, spec.User, spec.Start = mf.RootFS, mf.Layers, ms.WorkingDir, ms.User, ms.Start
	rec.Spec = encodeSpec(spec)
	if err := m.recordNew(ctx, rec, spec); err != nil {
		return Info{}, err
	}
	b := newBox(rec, spec)
	b.mu.Lock()
	defer b.mu.Unlock()
	m.register(b)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
	defer cancel()
	err = m.bringUp(pctx, b, mf, snap.ID)
	if err == nil {
		b.rec.ExpiresAt = m.cfg.Now().UTC().Add(time.Duration(b.rec.TimeoutSeconds) * time.Second)
		err = m.setState(pctx, b, StateRunning, "")
	}
	if err != nil {
		m.abandon(pctx, b)
		return Info{}, fmt.Errorf("create from %s: %w", snap.ID, err)
	}
	m.publish(EventCreated, b.rec, "from "+snap.ID)
	m.log.Info("sandbox created from snapshot", "id", rec.ID, "snapshot", snap.ID, "kind", mf.Kind)
	return *b.view.Load(), nil
}

// recoverFromSnapshot brings back a sandbox whose runtime died from its latest full snapshot.
// It reports whether it did. The caller holds b.mu; b is running (or was mid-operation).
func (m *Manager) recoverFromSnapshot(ctx context.Context, b *box, why string) bool {
	if m.cfg.Chunks == nil {
		return false
	}
	list, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{SandboxID: b.rec.ID})
	if err != nil {
		return false
	}
	var last *store.Snapshot
	for i := range list {
		if list[i].Kind == snapshot.KindFull {
			last = &list[i]
		}
	}
	if last == nil {
		return false
	}
	mf, err := m.readManifest(last.ID)
	if err == nil {
		err = mf.CheckLayers()
	}
	if err != nil {
		m.log.Error("cannot recover from snapshot", "id", b.rec.ID, "snapshot", last.ID, "err", err)
		return false
	}
	// From running (checkHealth, probe) or pausing (adopt); a resume a restart interrupted
	// (adopt) is resuming already and goes on as this one.
	if State(b.rec.State) != StateResuming {
		if err := m.setState(ctx, b, StateResuming, ""); err != nil {
			return false
		}
	}
	if err := m.bringUp(ctx, b, mf, last.ID); err != nil {
		m.log.Error("recovery from snapshot failed", "id", b.rec.ID, "snapshot", last.ID, "err", err)
		m.stopRuntime(ctx, b, "stopped")
		return false // still resuming: the caller records the crash (resuming → error)
	}
	if b.rec.ExpiresAt.IsZero() {
		b.rec.ExpiresAt = m.cfg.Now().UTC().Add(time.Duration(max(b.rec.TimeoutSeconds, 1)) * time.Second)
	}
	if err := m.setState(ctx, b, StateRunning, ""); err != nil {
		return false
	}
	reason := fmt.Sprintf("%s; restored from snapshot %s of %s", why, last.ID, last.CreatedAt.Format(time.RFC3339))
	m.publish(EventRecovered, b.rec, reason)
	m.log.Warn("sandbox recovered from its latest full snapshot", "id", b.rec.ID, "snapshot", last.ID, "why", why)
	return true
}
