package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store"
)

// Shared layers: the files a fork's copies (or the sandboxes made from one snapshot) start with
// are kept once, as a read-only layer under StateDir/layers stacked over the template, and each
// sandbox writes only to its own empty writable layer above it. A layer stays while a sandbox or
// a snapshot names it, and goes with the last of them.

func (m *Manager) layersDir() string { return filepath.Join(m.cfg.StateDir, "layers") }

// pinLayer keeps gcLayers off a layer being set up; the returned func releases it.
func (m *Manager) pinLayer(dir string) func() {
	m.mu.Lock()
	m.pinned[dir]++
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if m.pinned[dir]--; m.pinned[dir] <= 0 {
			delete(m.pinned, dir)
		}
		m.mu.Unlock()
	}
}

// shareUpper turns the writable layer of checkpoint directory ckpt into a shared layer (it is
// replaced by an empty one) and returns the layer's path, pinned until unpin is called.
func (m *Manager) shareUpper(ckpt string) (layer string, unpin func(), err error) {
	layer = filepath.Join(m.layersDir(), newID("fork_", 16))
	unpin = m.pinLayer(layer)
	//confine:host spaced's shared-layer directory and the layer directories by their own paths, not paths inside them
	if err := os.MkdirAll(m.layersDir(), 0o700); err != nil {
		unpin()
		return "", nil, err
	}
	if err := os.Rename(filepath.Join(ckpt, "upper"), layer); err != nil {
		unpin()
		return "", nil, err
	}
	if err := os.Mkdir(filepath.Join(ckpt, "upper"), 0o755); err != nil {
		unpin()
		return "", nil, err
	}
	// Copies (and their later snapshots) rely on it: on disk before any copy runs on it.
	if err := durable.SyncTree(layer); err != nil {
		unpin()
		return "", nil, err
	}
	return layer, unpin, nil
}

// snapshotLayer returns the shared layer holding snapshot sid's files, writing it from the chunk
// store the first time; pinned until unpin is called.
func (m *Manager) snapshotLayer(sid string, mf *snapshot.Manifest) (layer string, unpin func(), err error) {
	cs, err := m.chunkStore()
	if err != nil {
		return "", nil, err
	}
	layer = filepath.Join(m.layersDir(), sid)
	unpin = m.pinLayer(layer)
	m.layerMu.Lock()
	defer m.layerMu.Unlock()
	//confine:host spaced's shared-layer directory and the layer directories by their own paths, not paths inside them
	if _, err := os.Stat(layer); err == nil {
		return layer, unpin, nil
	}
	tmp := filepath.Join(m.layersDir(), ".tmp-"+newID("", 12))
	if err := cs.WriteLayer(mf.Upper, tmp, layer); err != nil {
		unpin()
		return "", nil, fmt.Errorf("snapshot %s: %w", sid, err)
	}
	return layer, unpin, nil
}

// gcLayers removes shared layers no sandbox, snapshot or setup in progress names.
func (m *Manager) gcLayers(ctx context.Context) {
	if m.cfg.StateDir == "" {
		return
	}
	//confine:host spaced's shared-layer directory and the layer directories by their own paths, not paths inside them
	entries, err := os.ReadDir(m.layersDir())
	if err != nil || len(entries) == 0 {
		return
	}
	m.layerMu.Lock()
	defer m.layerMu.Unlock()
	used := map[string]bool{}
	for _, b := range m.snapshotBoxes() {
		for _, l := range b.view.Load().Spec.Layers {
			used[l] = true
		}
	}
	if m.snaps != nil {
		snaps, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{})
		if err != nil {
			m.log.Error("list snapshots for layer cleanup", "err", err)
			return
		}
		for _, s := range snaps {
			mf, err := m.readManifest(s.ID)
			if err != nil {
				m.log.Error("read snapshot for layer cleanup; keeping every layer", "snapshot", s.ID, "err", err)
				return
			}
			for _, l := range mf.Layers {
				used[l] = true
			}
		}
	}
	m.mu.Lock()
	for l := range m.pinned {
		used[l] = true
	}
	m.mu.Unlock()
	for _, e := range entries {
		dir := filepath.Join(m.layersDir(), e.Name())
		if used[dir] || (strings.HasPrefix(e.Name(), ".tmp-") && recent(e)) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			m.log.Warn("remove shared layer", "layer", dir, "err", err)
			continue
		}
		m.log.Info("removed shared layer nothing uses", "layer", e.Name())
	}
}

// recent reports whether e was modified in the last minute (a layer still being written).
func recent(e os.DirEntry) bool {
	fi, err := e.Info()
	return err == nil && time.Since(fi.ModTime()) < time.Minute
}

// onSharedLayer reports whether a sandbox stands on a shared layer (so that removing it may
// leave one unused).
func (m *Manager) onSharedLayer(s Spec) bool {
	return slices.ContainsFunc(s.Layers, m.isShared)
}

// isShared reports whether layer l is a shared layer (not a template's).
func (m *Manager) isShared(l string) bool {
	return m.cfg.StateDir != "" && filepath.Dir(l) == m.layersDir()
}

// withLayer returns layers with extra on top.
func withLayer(layers []string, extra string) []string {
	return append(slices.Clone(layers), extra)
}
