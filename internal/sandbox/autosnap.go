package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store"
)

// errUnchanged ends an automatic snapshot of files that did not change.
var errUnchanged = errors.New("files unchanged since the last snapshot")

// autoSnapshots takes the automatic snapshots that are due, once a second, until Close.
func (m *Manager) autoSnapshots() {
	defer m.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := map[string]time.Time{} // sandbox → when its last automatic snapshot was considered
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		seen := map[string]bool{}
		for _, b := range m.snapshotBoxes() {
			v := b.view.Load()
			a := v.Spec.AutoSnapshot
			if a == nil || v.State != StateRunning {
				continue
			}
			seen[b.id] = true
			at, ok := last[b.id]
			if !ok {
				last[b.id] = now // the first one an interval from now (or from this start)
				continue
			}
			if now.Sub(at) < time.Duration(a.IntervalSeconds)*time.Second {
				continue
			}
			// Each sandbox's snapshot is a job of its own: a slow one never holds up the others.
			// With every worker busy it is tried again at the next tick.
			keep := a.Keep
			if m.background("autosnap", b.id, func(context.Context) { m.autoSnapshot(b, keep) }) {
				last[b.id] = now
			}
		}
		for id := range last {
			if !seen[id] {
				delete(last, id)
			}
		}
	}
}

// autoSnapshot takes one automatic snapshot of b if its files changed and prunes old ones.
func (m *Manager) autoSnapshot(b *box, keep int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	info, err := m.Snapshot(ctx, b.tenant, b.id, snapshot.Request{Kind: snapshot.KindFilesystem, Label: snapshot.AutoLabel, OnlyIfChanged: true})
	if err != nil {
		m.log.Warn("automatic snapshot failed", "id", b.id, "err", err)
		return
	}
	if info.ID == "" {
		return
	}
	list, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{SandboxID: b.id})
	if err != nil {
		m.log.Warn("list automatic snapshots", "id", b.id, "err", err)
		return
	}
	for _, s := range snapshot.Prune(list, keep) {
		if err := m.DeleteSnapshot(ctx, b.tenant, s.ID); err != nil {
			m.log.Warn("prune automatic snapshot", "snapshot", s.ID, "err", err)
			return
		}
	}
}
