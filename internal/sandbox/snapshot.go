package sandbox

import (
	"context"
	"encoding/json"
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
	"github.com/space-sandbox/space/internal/store"
)

// Snapshot kinds.
const (
	KindFilesystem = "filesystem" // the files of the writable layer
	KindFull       = "full"       // memory, processes and files of one instant
)

// Event types of snapshots and restores.
const (
	EventSnapshotted = "snapshot.created"
	EventRestored    = "sandbox.restored"
)

// maxLabel bounds a snapshot's label.
const maxLabel = 128

// SnapshotInfo is a snapshot as the API shows it.
type SnapshotInfo struct {
	ID          string    `json:"id"`
	SandboxID   string    `json:"sandbox_id"`
	Kind        string    `json:"kind"`
	Label       string    `json:"label"`
	ParentID    string    `json:"parent_id"`
	CreatedAt   time.Time `json:"created_at"`
	SizeBytes   int64     `json:"size_bytes"`
	StoredBytes int64     `json:"stored_bytes"`
}

func snapshotInfo(s store.Snapshot) SnapshotInfo {
	return SnapshotInfo{ID: s.ID, SandboxID: s.SandboxID, Kind: s.Kind, Label: s.Label, ParentID: s.ParentID,
		CreatedAt: s.CreatedAt, SizeBytes: s.SizeBytes, StoredBytes: s.StoredBytes}
}

// manifest is a snapshot's content description, kept as the chunk store root of its ID.
type manifest struct {
	Version   int    `json:"version"`
	Kind      string `json:"kind"`
	SandboxID string `json:"sandbox_id"`
	// What the sandbox was: a sandbox made from the snapshot starts like it.
	Template   string            `json:"template"`
	Runtime    string            `json:"runtime"`
	Env        map[string]string `json:"env,omitempty"`
	Spec       Spec              `json:"spec"`
	AgentToken string            `json:"agent_token,omitempty"` // the token in a full snapshot's memory
	Upper      fstree.Tree       `json:"upper"`                 // the writable layer
	// Private holds the shared layers (of a fork or an earlier snapshot) among Spec.Layers, by
	// path, so that the snapshot can bring them back if they are gone.
	Private    map[string]fstree.Tree `json:"private,omitempty"`
	Checkpoint *fstree.Tree           `json:"checkpoint,omitempty"` // full: the runtime's image without the layer
}

const manifestVersion = 1

func (mf *manifest) chunks() []string {
	out := mf.Upper.Chunks()
	for _, t := range mf.Private {
		out = append(out, t.Chunks()...)
	}
	if mf.Checkpoint != nil {
		out = append(out, mf.Checkpoint.Chunks()...)
	}
	return out
}

func (m *Manager) chunkStore() (*cas.Store, error) {
	if m.cfg.Chunks == nil || m.cfg.StateDir == "" {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "this server keeps no snapshots (no chunk store configured)")
	}
	return m.cfg.Chunks, nil
}

// SnapshotRequest asks for a snapshot.
type SnapshotRequest struct {
	Kind  string
	Label string
	// OnlyIfChanged skips a filesystem snapshot whose files equal the sandbox's latest
	// snapshot (automatic snapshots); the result is then the zero SnapshotInfo.
	OnlyIfChanged bool
}

// Snapshot records the sandbox's files (filesystem) or its whole state (full) in the chunk store.
// Only what the store lacks is written; the result says how much that was. A running sandbox
// keeps running: a filesystem snapshot stops it only for a final pass over files changed while
// the rest was copied, a full one for its checkpoint.
func (m *Manager) Snapshot(ctx context.Context, tenant, id string, req SnapshotRequest) (SnapshotInfo, error) {
	cs, err := m.chunkStore()
	if err != nil {
		return SnapshotInfo{}, err
	}
	switch req.Kind {
	case "":
		req.Kind = KindFilesystem
	case KindFilesystem, KindFull:
	default:
		return SnapshotInfo{}, errdefs.InvalidArgument(fmt.Sprintf("kind %q: want filesystem or full", req.Kind))
	}
	if len(req.Label) > maxLabel || strings.ContainsRune(req.Label, 0) {
		return SnapshotInfo{}, errdefs.InvalidArgument(fmt.Sprintf("label: at most %d characters, no NUL", maxLabel))
	}
	b, err := m.lookup(tenant, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
	defer cancel()
	st := State(b.rec.State)
	if st != StateRunning && st != StatePaused {
		return SnapshotInfo{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s", id, st))
	}
	prev, prevMF, err := m.latestSnapshot(ctx, b)
	if err != nil {
		return SnapshotInfo{}, err
	}
	t0 := time.Now()
	tx := cs.Begin()
	defer tx.Abort() // a no-op after Commit
	mf := manifest{Version: manifestVersion, Kind: req.Kind, SandboxID: b.rec.ID, Template: b.rec.Template,
		Runtime: b.rec.Runtime, Env: b.rec.Env, Spec: b.spec}
	mf.Spec.Parent = nil
	var frozen time.Duration
	switch {
	case st == StatePaused && req.Kind == KindFilesystem:
		mf.Upper, err = fstree.Capture(tx, filepath.Join(m.checkpointDir(b.rec.ID), "upper"), nil, time.Time{})
	case st == StatePaused:
		err = m.captureCheckpoint(tx, m.checkpointDir(b.rec.ID), &mf)
		mf.AgentToken = b.rec.AccessToken
	case req.Kind == KindFilesystem:
		frozen, err = m.captureLayer(ctx, tx, b, prevMF, req.OnlyIfChanged, &mf)
	default:
		frozen, err = m.captureFull(ctx, tx, b, &mf)
		mf.AgentToken = b.rec.AccessToken
	}
	if err == nil {
		err = m.capturePrivate(tx, b, prevMF, &mf)
	}
	if errors.Is(err, errUnchanged) {
		return SnapshotInfo{}, nil
	}
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if req.OnlyIfChanged && prevMF != nil && prevMF.Kind == KindFilesystem && sameFiles(prevMF.Upper, mf.Upper) {
		return SnapshotInfo{}, nil
	}
	data, err := json.Marshal(mf)
	if err != nil {
		return SnapshotInfo{}, err
	}
	rec := store.Snapshot{
		ID: newID("snp_", 20), Tenant: b.rec.Tenant, SandboxID: b.rec.ID, Kind: req.Kind, Label: req.Label,
		CreatedAt: m.cfg.Now().UTC(), SizeBytes: mf.Upper.Size(),
	}
	if mf.Checkpoint != nil {
		rec.SizeBytes += mf.Checkpoint.Size()
	}
	switch {
	case prev != nil:
		rec.ParentID = prev.ID
	case b.spec.Parent != nil:
		rec.ParentID = b.spec.Parent.SnapshotID
	}
	rootBytes, err := tx.Commit(rec.ID, data, mf.chunks())
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	m.crash(crashpoint.SnapStored)
	// New to this tenant's snapshots, not to the store: what other tenants hold is no business
	// of this one (stored.go).
	if rec.StoredBytes, err = m.storedForTenant(ctx, cs, b.rec.Tenant, rec.ID, rootBytes); err != nil {
		if derr := cs.Delete(rec.ID); derr != nil {
			m.log.Error("remove unrecorded snapshot", "id", rec.ID, "err", derr)
		}
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if err := m.cfg.Store.CreateSnapshot(ctx, rec); err != nil {
		if derr := cs.Delete(rec.ID); derr != nil {
			m.log.Error("remove unrecorded snapshot", "id", rec.ID, "err", derr)
		}
		return SnapshotInfo{}, fmt.Errorf("record snapshot: %w", err)
	}
	m.publish(EventSnapshotted, b.rec, rec.ID)
	m.log.Info("snapshot taken", "sandbox", id, "snapshot", rec.ID, "kind", rec.Kind,
		"size", rec.SizeBytes, "stored", rec.StoredBytes, "stopped", frozen.Round(time.Microsecond),
		"took", time.Since(t0).Round(time.Millisecond))
	return snapshotInfo(rec), nil
}

// sameFiles reports whether two captures of a writable layer hold the same files.
func sameFiles(a, b fstree.Tree) bool {
	return len(fstree.Diff(a, b, func(string) bool { return false })) == 0 && len(a.Entries) == len(b.Entries)
}

// capturePrivate records the sandbox's shared layers. They never change, so after the first
// snapshot that holds them nothing is read again.
func (m *Manager) capturePrivate(tx *cas.Txn, b *box, prev *manifest, mf *manifest) error {
	for _, l := range b.spec.Layers {
		if !m.isShared(l) {
			continue
		}
		var prevIdx map[string]fstree.Entry
		var prevAt time.Time
		if prev != nil {
			if t, ok := prev.Private[l]; ok {
				prevIdx, prevAt = t.Index(), t.CapturedAt
			}
		}
		t, err := fstree.Capture(tx, l, prevIdx, prevAt)
		if err != nil {
			return fmt.Errorf("shared layer %s: %w", filepath.Base(l), err)
		}
		if mf.Private == nil {
			mf.Private = map[string]fstree.Tree{}
		}
		mf.Private[l] = t
	}
	return nil
}

// captureLayer records a running sandbox's writable layer: a first pass while it runs, then a
// pass with the sandbox frozen that reads again only files changed since the first.
func (m *Manager) captureLayer(ctx context.Context, tx *cas.Txn, b *box, prev *manifest, onlyIfChanged bool, mf *manifest) (time.Duration, error) {
	lc, ok := m.cfg.Drivers[b.rec.Runtime].(runtime.LayerCapturer)
	if !ok {
		return 0, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("runtime %s cannot snapshot files", b.rec.Runtime))
	}
	dir, err := lc.WritableLayer(b.rec.ID)
	if err != nil {
		return 0, err
	}
	var prevIdx map[string]fstree.Entry
	var prevAt time.Time
	if prev != nil {
		prevIdx, prevAt = prev.Upper.Index(), prev.Upper.CapturedAt
	}
	first, err := fstree.Capture(tx, dir, prevIdx, prevAt)
	if err != nil {
		return 0, err
	}
	if first.Racy() {
		// Files written just before the first pass would all be read again while frozen; a
		// second pass a moment later reads them while the sandbox still runs.
		time.Sleep(time.Until(first.CapturedAt.Add(fstree.RacyWindow)))
		if first, err = fstree.Capture(tx, dir, first.Index(), first.CapturedAt); err != nil {
			return 0, err
		}
	}
	if onlyIfChanged && prev != nil && prev.Kind == KindFilesystem && sameFiles(prev.Upper, first) {
		return 0, errUnchanged // no need to stop the sandbox
	}
	// The sandbox is stopped from just before fn runs until the resume returns.
	var stoppedAt time.Time
	var pass time.Duration
	err = lc.Freeze(ctx, b.rec.ID, func(dir string) error {
		stoppedAt = time.Now()
		m.crash(crashpoint.SnapFrozen)
		final, err := fstree.Capture(tx, dir, first.Index(), first.CapturedAt)
		pass = time.Since(stoppedAt)
		mf.Upper = final
		return err
	})
	m.log.Debug("file snapshot final pass", "id", b.rec.ID, "pass", pass)
	return time.Since(stoppedAt), err
}

// captureFull checkpoints a running sandbox (it keeps running) and records the image.
func (m *Manager) captureFull(ctx context.Context, tx *cas.Txn, b *box, mf *manifest) (time.Duration, error) {
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
	if err := cp.Checkpoint(ctx, b.rec.ID, dir, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		return 0, err
	}
	m.crash(crashpoint.SnapFullFrozen)
	frozen := time.Since(t0)
	return frozen, m.captureCheckpoint(tx, dir, mf)
}

// captureCheckpoint records a checkpoint directory: its upper/ as the writable layer, the rest
// as the runtime's image.
func (m *Manager) captureCheckpoint(tx *cas.Txn, dir string, mf *manifest) error {
	all, err := fstree.Capture(tx, dir, nil, time.Time{})
	if err != nil {
		return err
	}
	img := fstree.Tree{CapturedAt: all.CapturedAt}
	mf.Upper = fstree.Tree{CapturedAt: all.CapturedAt}
	for _, e := range all.Entries {
		switch {
		case e.Path == "upper":
		case strings.HasPrefix(e.Path, "upper/"):
			e.Path = strings.TrimPrefix(e.Path, "upper/")
			mf.Upper.Entries = append(mf.Upper.Entries, e)
		default:
			img.Entries = append(img.Entries, e)
		}
	}
	mf.Checkpoint = &img
	return nil
}

// latestSnapshot returns the sandbox's newest snapshot and its manifest, if it has any.
func (m *Manager) latestSnapshot(ctx context.Context, b *box) (*store.Snapshot, *manifest, error) {
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

func (m *Manager) readManifest(sid string) (*manifest, error) {
	cs, err := m.chunkStore()
	if err != nil {
		return nil, err
	}
	data, err := cs.Root(sid)
	if err != nil {
		return nil, err
	}
	var mf manifest
	if err := json.Unmarshal(data, &mf); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w: %v", sid, cas.ErrCorrupt, err)
	}
	if mf.Version != manifestVersion {
		return nil, fmt.Errorf("snapshot %s has format %d; this server reads %d", sid, mf.Version, manifestVersion)
	}
	return &mf, nil
}

// snapshotOf returns tenant's snapshot sid (404 for another tenant's).
func (m *Manager) snapshotOf(ctx context.Context, tenant, sid string) (store.Snapshot, error) {
	if !ValidSnapshotID(sid) {
		return store.Snapshot{}, errdefs.InvalidArgument(fmt.Sprintf("%q is not a snapshot ID", sid))
	}
	rec, err := m.cfg.Store.GetSnapshot(ctx, sid)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && rec.Tenant != tenant) {
		return store.Snapshot{}, errdefs.NotFound(fmt.Sprintf("snapshot %s not found", sid))
	}
	return rec, err
}

// ValidSnapshotID reports whether s has the shape of a snapshot ID.
func ValidSnapshotID(s string) bool { return snapshotIDRE.MatchString(s) }

// GetSnapshot returns one of tenant's snapshots.
func (m *Manager) GetSnapshot(ctx context.Context, tenant, sid string) (SnapshotInfo, error) {
	rec, err := m.snapshotOf(ctx, tenant, sid)
	if err != nil {
		return SnapshotInfo{}, err
	}
	return snapshotInfo(rec), nil
}

// Snapshots lists a sandbox's snapshots, oldest first.
func (m *Manager) Snapshots(ctx context.Context, tenant, id string) ([]SnapshotInfo, error) {
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
	out := make([]SnapshotInfo, 0, len(list))
	for _, s := range list {
		out = append(out, snapshotInfo(s))
	}
	return out, nil
}

// AllSnapshots lists every snapshot of tenant, oldest first, including those of deleted sandboxes.
func (m *Manager) AllSnapshots(ctx context.Context, tenant string) ([]SnapshotInfo, error) {
	list, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{Tenant: tenant})
	if err != nil {
		return nil, err
	}
	out := make([]SnapshotInfo, 0, len(list))
	for _, s := range list {
		out = append(out, snapshotInfo(s))
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
	defer m.forgetTenantChunks(tenant)
	// The record first: a crash in between leaves a root no record names, which Recover removes.
	if err := m.cfg.Store.DeleteSnapshot(ctx, sid); err != nil {
		return err
	}
	if err := cs.Delete(sid); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("delete snapshot %s: %w", sid, err)
	}
	m.log.Info("snapshot deleted", "snapshot", sid)
	m.gcLayers(ctx)
	return nil
}

// reconcileSnapshots makes the chunk store and the snapshot records agree after a crash:
// content no record names is removed; a record whose content is gone is removed and reported.
func (m *Manager) reconcileSnapshots(ctx context.Context) error {
	cs := m.cfg.Chunks
	if cs == nil {
		return nil
	}
	recs, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{})
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, r := range recs {
		known[r.ID] = true
	}
	roots, err := cs.Roots()
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, name := range roots {
		have[name] = true
		if !known[name] {
			m.log.Warn("removing snapshot content no record names", "snapshot", name)
			if err := cs.Delete(name); err != nil {
				m.log.Error("remove snapshot content", "snapshot", name, "err", err)
			}
		}
	}
	for _, r := range recs {
		if !have[r.ID] {
			m.log.Error("snapshot record without content; removing it", "snapshot", r.ID)
			if err := m.cfg.Store.DeleteSnapshot(ctx, r.ID); err != nil {
				m.log.Error("remove snapshot record", "snapshot", r.ID, "err", err)
			}
		}
	}
	return nil
}
