package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/fstree"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store"
)

// Event types of snapshots and restores.
const (
	EventSnapshotted = "snapshot.created"
	EventRestored    = "sandbox.restored"
)

func (m *Manager) chunkStore() (*snapshot.Store, error) {
	if m.snaps == nil || m.cfg.StateDir == "" {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "this server keeps no snapshots (no chunk store configured)")
	}
	return m.snaps, nil
}

// Snapshot records the sandbox's files (filesystem) or its whole state (full) in the chunk store.
// Only what the store lacks is written; the result says how much that was. A running sandbox
// keeps running: a filesystem snapshot stops it only for a final pass over files changed while
// the rest was copied, a full one for its checkpoint.
func (m *Manager) Snapshot(ctx context.Context, tenant, id string, req snapshot.Request) (snapshot.Info, error) {
	cs, err := m.chunkStore()
	if err != nil {
		return snapshot.Info{}, err
	}
	switch req.Kind {
	case "":
		req.Kind = snapshot.KindFilesystem
	case snapshot.KindFilesystem, snapshot.KindFull:
	default:
		return snapshot.Info{}, errdefs.InvalidArgument(fmt.Sprintf("kind %q: want filesystem or full", req.Kind))
	}
	if len(req.Label) > snapshot.MaxLabel || strings.ContainsRune(req.Label, 0) {
		return snapshot.Info{}, errdefs.InvalidArgument(fmt.Sprintf("label: at most %d characters, no NUL", snapshot.MaxLabel))
	}
	b, err := m.lookup(tenant, id)
	if err != nil {
		return snapshot.Info{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
	defer cancel()
	st := State(b.rec.State)
	if st != StateRunning && st != StatePaused {
		return snapshot.Info{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s", id, st))
	}
	prev, prevMF, err := m.latestSnapshot(ctx, b)
	if err != nil {
		return snapshot.Info{}, err
	}
	t0 := time.Now()
	tx := cs.Begin()
	defer tx.Abort() // a no-op after Commit
	spec := b.spec
	spec.Parent = nil
	mf, err := snapshot.NewManifest(req.Kind, b.rec.ID, b.rec.Template, b.rec.Runtime, b.rec.Env, encodeSpec(spec))
	if err != nil {
		return snapshot.Info{}, err
	}
	var frozen time.Duration
	switch {
	case st == StatePaused && req.Kind == snapshot.KindFilesystem:
		mf.Upper, err = snapshot.Capture(tx, filepath.Join(m.checkpointDir(b.rec.ID), "upper"), nil)
	case st == StatePaused:
		err = snapshot.CaptureCheckpoint(tx, m.checkpointDir(b.rec.ID), mf)
		mf.AgentToken = b.rec.AccessToken
	case req.Kind == snapshot.KindFilesystem:
		frozen, err = m.captureLayer(ctx, tx, b, prevMF, req.OnlyIfChanged, mf)
	default:
		frozen, err = m.captureFull(ctx, tx, b, mf)
		mf.AgentToken = b.rec.AccessToken
	}
	if err == nil {
		err = snapshot.CapturePrivate(tx, m.isShared, prevMF, mf)
	}
	if errors.Is(err, errUnchanged) {
		return snapshot.Info{}, nil
	}
	if err != nil {
		return snapshot.Info{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if req.OnlyIfChanged && snapshot.Unchanged(prevMF, mf.Upper) {
		return snapshot.Info{}, nil
	}
	rec := store.Snapshot{
		ID: newID("snp_", 20), Tenant: b.rec.Tenant, SandboxID: b.rec.ID, Kind: req.Kind, Label: req.Label,
		CreatedAt: m.cfg.Now().UTC(), SizeBytes: mf.Size(),
	}
	switch {
	case prev != nil:
		rec.ParentID = prev.ID
	case b.spec.Parent != nil:
		rec.ParentID = b.spec.Parent.SnapshotID
	}
	rootBytes, err := cs.Commit(tx, rec.ID, mf)
	if err != nil {
		return snapshot.Info{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	m.crash(crashpoint.SnapStored)
	// New to this tenant's snapshots, not to the store: what other tenants hold is no business
	// of this one (internal/snapshot).
	if rec.StoredBytes, err = cs.StoredForTenant(ctx, b.rec.Tenant, rec.ID, rootBytes); err != nil {
		if derr := cs.Delete(rec.ID); derr != nil {
			m.log.Error("remove unrecorded snapshot", "id", rec.ID, "err", derr)
		}
		return snapshot.Info{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if err := m.holdTemplates(ctx, rec.ID, mf.RootFS, mf.Layers); err != nil {
		if derr := cs.Delete(rec.ID); derr != nil {
			m.log.Error("remove unrecorded snapshot", "id", rec.ID, "err", derr)
		}
		return snapshot.Info{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if err := m.cfg.Store.CreateSnapshot(ctx, rec); err != nil {
		m.releaseTemplates(rec.ID, mf.RootFS, mf.Layers)
		if derr := cs.Delete(rec.ID); derr != nil {
			m.log.Error("remove unrecorded snapshot", "id", rec.ID, "err", derr)
		}
		return snapshot.Info{}, fmt.Errorf("record snapshot: %w", err)
	}
	m.publish(EventSnapshotted, b.rec, rec.ID)
	m.log.Info("snapshot taken", "sandbox", id, "snapshot", rec.ID, "kind", rec.Kind,
		"size", rec.SizeBytes, "stored", rec.StoredBytes, "stopped", frozen.Round(time.Microsecond),
		"took", time.Since(t0).Round(time.Millisecond))
	return snapshot.InfoOf(rec), nil
}

// captureLayer records a running sandbox's writable layer: a first pass while it runs, then a
// pass with the sandbox frozen that reads again only files changed since the first.
func (m *Manager) captureLayer(ctx context.Context, tx *cas.Txn, b *box, prev *snapshot.Manifest, onlyIfChanged bool, mf *snapshot.Manifest) (time.Duration, error) {
	lc, ok := m.cfg.Drivers[b.rec.Runtime].(runtime.LayerCapturer)
	if !ok {
		return 0, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("runtime %s cannot snapshot files", b.rec.Runtime))
	}
	dir, err := lc.WritableLayer(b.rec.ID)
	if err != nil {
		return 0, err
	}
	var last *fstree.Tree
	if prev != nil {
		last = &prev.Upper
	}
	first, err := snapshot.CaptureRunning(tx, dir, last)
	if err != nil {
		return 0, err
	}
	if onlyIfChanged && snapshot.Unchanged(prev, first) {
		return 0, errUnchanged // no need to stop the sandbox
	}
	// The sandbox is stopped from just before fn runs until the resume returns.
	var stoppedAt time.Time
	var pass time.Duration
	err = lc.Freeze(ctx, b.rec.ID, func(dir string) error {
		stoppedAt = time.Now()
		m.crash(crashpoint.SnapFrozen)
		final, err := snapshot.Capture(tx, dir, &first)
		pass = time.Since(stoppedAt)
		mf.Upper = final
		return err
	})
	m.log.Debug("file snapshot final pass", "id", b.rec.ID, "pass", pass)
	return time.Since(stoppedAt), err
}

// captureFull checkpoints a running sandbox (it keeps running) and records the image.
func (m *Manager) captureFull(ctx context.Context, tx *cas.Txn, b *box, mf *snapshot.Manifest) (time.Duration, error) {
	cp, err := m.checkpointer(b)
	if err != nil {
		return 0, err
	}
	dir := filepath.Join(m.cfg.StateDir, "work", newID("ckpt_", 12))
	//confine:host spaced's state directory
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	t0 := time.Now()
	if err := m.roomForCheckpoint(ctx, b, "take a full snapshot"); err != nil {
		return 0, err
	}
	if err := cp.Checkpoint(ctx, b.rec.ID, dir, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		return 0, errdefs.NoSpace(err)
	}
	m.crash(crashpoint.SnapFullFrozen)
	frozen := time.Since(t0)
	return frozen, snapshot.CaptureCheckpoint(tx, dir, mf)
}

// latestSnapshot returns the sandbox's newest snapshot and its manifest, if it has any.
func (m *Manager) latestSnapshot(ctx context.Context, b *box) (*store.Snapshot, *snapshot.Manifest, error) {
	list, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{SandboxID: b.rec.ID})
	if err != nil || len(list) == 0 {
		return nil, nil, err
	}
	last := list[len(list)-1]
	mf, err := m.readManifest(last.ID)
	if err != nil {
		m.log.Warn("latest snapshot unreadable; taking a whole new one", "snapshot", last.ID, "err", err)
		return &last, nil, nil
	}
	return &last, mf, nil
}

func (m *Manager) readManifest(sid string) (*snapshot.Manifest, error) {
	cs, err := m.chunkStore()
	if err != nil {
		return nil, err
	}
	return cs.Read(sid)
}

// snapshotOf returns tenant's snapshot sid (404 for another tenant's).
func (m *Manager) snapshotOf(ctx context.Context, tenant, sid string) (store.Snapshot, error) {
	if !snapshot.ValidID(sid) {
		return store.Snapshot{}, errdefs.InvalidArgument(fmt.Sprintf("%q is not a snapshot ID", sid))
	}
	rec, err := m.cfg.Store.GetSnapshot(ctx, sid)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && rec.Tenant != tenant) {
		return store.Snapshot{}, errdefs.NotFound(fmt.Sprintf("snapshot %s not found", sid))
	}
	return rec, err
}

// GetSnapshot returns one of tenant's snapshots.
func (m *Manager) GetSnapshot(ctx context.Context, tenant, sid string) (snapshot.Info, error) {
	rec, err := m.snapshotOf(ctx, tenant, sid)
	if err != nil {
		return snapshot.Info{}, err
	}
	return snapshot.InfoOf(rec), nil
}

// Snapshots lists a sandbox's snapshots, oldest first.
func (m *Manager) Snapshots(ctx context.Context, tenant, id string) ([]snapshot.Info, error) {
	if !ValidID(id) {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("%q is not a sandbox ID", id))
	}
	list, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{Tenant: tenant, SandboxID: id})
	if err != nil {
		return nil, err
	}
	if len(list) == 0 {
		if _, err := m.lookup(tenant, id); err != nil {
			return nil, err
		}
	}
	out := make([]snapshot.Info, 0, len(list))
	for _, s := range list {
		out = append(out, snapshot.InfoOf(s))
	}
	return out, nil
}

// AllSnapshots lists every snapshot of tenant, oldest first, including those of deleted sandboxes.
func (m *Manager) AllSnapshots(ctx context.Context, tenant string) ([]snapshot.Info, error) {
	list, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{Tenant: tenant})
	if err != nil {
		return nil, err
	}
	out := make([]snapshot.Info, 0, len(list))
	for _, s := range list {
		out = append(out, snapshot.InfoOf(s))
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot; chunks no other snapshot needs go with it. Snapshots made
// after it keep everything they need.
func (m *Manager) DeleteSnapshot(ctx context.Context, tenant, sid string) error {
	cs, err := m.chunkStore()
	if err != nil {
		return err
	}
	if _, err := m.snapshotOf(ctx, tenant, sid); err != nil {
		return err
	}
	defer cs.ForgetTenant(tenant)
	mf, mfErr := cs.Read(sid) // what it stands on, to let go of after
	// The record first: a crash in between leaves a root no record names, which Recover removes.
	if err := m.cfg.Store.DeleteSnapshot(ctx, sid); err != nil {
		return err
	}
	if mfErr == nil {
		m.releaseTemplates(sid, mf.RootFS, mf.Layers)
	}
	if err := cs.Delete(sid); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("delete snapshot %s: %w", sid, err)
	}
	m.log.Info("snapshot deleted", "snapshot", sid)
	m.gcLayers(ctx)
	return nil
}

// reconcileSnapshots makes the chunk store and the snapshot records agree after a crash
// (internal/snapshot).
func (m *Manager) reconcileSnapshots(ctx context.Context) error {
	if m.snaps == nil {
		return nil
	}
	return m.snaps.Reconcile(ctx)
}

// Lineage returns the tree a sandbox belongs to: every sandbox and snapshot of the tenant
// connected to it through parents, oldest first (snapshot.Lineage).
func (m *Manager) Lineage(ctx context.Context, tenant, id string) ([]snapshot.LineageNode, error) {
	if _, err := m.lookup(tenant, id); err != nil {
		return nil, err
	}
	snaps, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{Tenant: tenant})
	if err != nil {
		return nil, err
	}
	var boxes []snapshot.LineageNode
	for _, b := range m.snapshotBoxes() {
		if b.tenant != tenant {
			continue
		}
		v := b.view.Load()
		n := snapshot.LineageNode{ID: v.ID, Kind: "sandbox", CreatedAt: v.CreatedAt, State: string(v.State)}
		if p := v.Spec.Parent; p != nil {
			n.ParentID = p.SnapshotID
			if n.ParentID == "" {
				n.ParentID = p.SandboxID
			}
		}
		boxes = append(boxes, n)
	}
	return snapshot.Lineage(id, boxes, snaps), nil
}

// Diff lists the files that differ from snapshot a to snapshot against… in the direction the
// API names: changes that lead from against to a.
func (m *Manager) Diff(ctx context.Context, tenant, a, against string) ([]fstree.Change, error) {
	if a == against {
		if _, err := m.snapshotOf(ctx, tenant, a); err != nil {
			return nil, err
		}
		return []fstree.Change{}, nil
	}
	var mfs [2]*snapshot.Manifest
	for i, sid := range []string{against, a} {
		if _, err := m.snapshotOf(ctx, tenant, sid); err != nil {
			return nil, err
		}
		mf, err := m.readManifest(sid)
		if err != nil {
			return nil, err
		}
		mfs[i] = mf
	}
	return snapshot.Diff(mfs[0], mfs[1])
}
