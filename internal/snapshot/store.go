package snapshot

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/fstree"
	"github.com/space-sandbox/space/internal/store"
)

// Records is where snapshot records live (internal/store).
type Records interface {
	ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]store.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// Store is the content of snapshots: their manifests and trees in the chunk store, and what
// each tenant's snapshots hold of it.
type Store struct {
	chunks  Chunks
	recs    Records
	log     *slog.Logger
	tenants tenantChunks
}

// New returns the snapshot content kept in chunks, recorded in recs.
func New(chunks Chunks, recs Records, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{chunks: chunks, recs: recs, log: log}
}

// Begin starts writing a snapshot's chunks.
func (s *Store) Begin() *cas.Txn { return s.chunks.Begin() }

// Commit writes mf as snapshot id's root, holding its chunks, and returns the root's size.
func (s *Store) Commit(tx *cas.Txn, id string, mf *Manifest) (int64, error) {
	data, err := json.Marshal(mf)
	if err != nil {
		return 0, err
	}
	return tx.Commit(id, data, mf.Chunks())
}

// Read returns snapshot sid's manifest.
func (s *Store) Read(sid string) (*Manifest, error) {
	data, err := s.chunks.Root(sid)
	if err != nil {
		return nil, err
	}
	return Decode(sid, data)
}

// Delete removes snapshot sid's content; chunks no other snapshot needs go with it.
func (s *Store) Delete(sid string) error { return s.chunks.Delete(sid) }

// Reconcile makes the chunk store and the snapshot records agree after a crash: content no
// record names is removed; a record whose content is gone is removed and reported.
func (s *Store) Reconcile(ctx context.Context) error {
	recs, err := s.recs.ListSnapshots(ctx, store.SnapshotFilter{})
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, r := range recs {
		known[r.ID] = true
	}
	roots, err := s.chunks.Roots()
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, name := range roots {
		have[name] = true
		if !known[name] {
			s.log.Warn("removing snapshot content no record names", "snapshot", name)
			if err := s.chunks.Delete(name); err != nil {
				s.log.Error("remove snapshot content", "snapshot", name, "err", err)
			}
		}
	}
	for _, r := range recs {
		if !have[r.ID] {
			s.log.Error("snapshot record without content; removing it", "snapshot", r.ID)
			if err := s.recs.DeleteSnapshot(ctx, r.ID); err != nil {
				s.log.Error("remove snapshot record", "snapshot", r.ID, "err", err)
			}
		}
	}
	return nil
}

// WriteTar writes, as a tar, the snapshot's view of rel (paths relative to the root, cleaned):
// its writable layer over its shared layers over the template's.
func (s *Store) WriteTar(w io.Writer, mf *Manifest, rel []string) error {
	view := fstree.NewView(append([]fstree.Layer{fstree.TreeLayer(mf.Upper)}, mf.lowerLayers()...)...)
	return fstree.WriteTar(w, s.chunks, view, rel)
}

// Materialize writes tree t into the existing empty directory dir.
func (s *Store) Materialize(t fstree.Tree, dir string) error {
	return fstree.Materialize(s.chunks, t, dir)
}

// WriteLayer writes tree t as the directory dst, durably: first into tmp (made here, removed on
// failure), then renamed. The caller keeps others off dst meanwhile.
func (s *Store) WriteLayer(t fstree.Tree, tmp, dst string) error {
	err := func() error {
		//confine:host spaced's shared-layer directory and the layer directories by their own paths, not paths inside them
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return err
		}
		if err := fstree.Materialize(s.chunks, t, tmp); err != nil {
			return err
		}
		if err := durable.SyncTree(tmp); err != nil {
			return err
		}
		return os.Rename(tmp, dst)
	}()
	if err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// lowerLayers are the layers under a snapshot's writable layer, topmost first: its shared
// layers from their records in the snapshot, the template's from disk.
func (mf *Manifest) lowerLayers() []fstree.Layer {
	var out []fstree.Layer
	for i := len(mf.Layers) - 1; i >= 0; i-- {
		l := mf.Layers[i]
		if t, ok := mf.Private[l]; ok {
			out = append(out, fstree.TreeLayer(t))
		} else {
			out = append(out, fstree.DirLayer(l))
		}
	}
	if mf.RootFS != "" {
		out = append(out, fstree.DirLayer(mf.RootFS))
	}
	return out
}

// Diff lists the files that differ from snapshot against to snapshot a: changes that lead from
// against to a. Both must be of one template.
func Diff(against, a *Manifest) ([]fstree.Change, error) {
	if against.RootFS != a.RootFS || fmt.Sprint(against.Layers) != fmt.Sprint(a.Layers) {
		return nil, errdefs.InvalidArgument("the two snapshots are of different templates; a file-level diff compares snapshots of one template")
	}
	lower := fstree.NewView(a.lowerLayers()...)
	inLower := func(p string) bool {
		_, ok, err := lower.Lookup(p)
		return ok && err == nil
	}
	out := fstree.Diff(against.Upper, a.Upper, inLower)
	if out == nil {
		out = []fstree.Change{}
	}
	return out, nil
}
