package sandbox

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/fstree"
	"github.com/space-sandbox/space/internal/store"
)

// LineageNode is one sandbox or snapshot of a lineage tree.
type LineageNode struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"` // sandbox or snapshot
	ParentID  string    `json:"parent_id"`
	CreatedAt time.Time `json:"created_at"`
	State     string    `json:"state,omitempty"` // sandboxes: their state, "deleted" if gone
	Label     string    `json:"label,omitempty"` // snapshots
}

// Lineage returns the tree a sandbox belongs to: every sandbox and snapshot of the tenant
// connected to it through parents (a snapshot's parent is its sandbox's previous snapshot, or
// the sandbox; a sandbox's is the snapshot or sandbox it was made from), oldest first.
func (m *Manager) Lineage(ctx context.Context, tenant, id string) ([]LineageNode, error) {
	if _, err := m.lookup(tenant, id); err != nil {
		return nil, err
	}
	snaps, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{Tenant: tenant})
	if err != nil {
		return nil, err
	}
	nodes := map[string]LineageNode{}
	for _, b := range m.snapshotBoxes() {
		if b.tenant != tenant {
			continue
		}
		v := b.view.Load()
		n := LineageNode{ID: v.ID, Kind: "sandbox", CreatedAt: v.CreatedAt, State: string(v.State)}
		if p := v.Spec.Parent; p != nil {
			n.ParentID = p.SnapshotID
			if n.ParentID == "" {
				n.ParentID = p.SandboxID
			}
		}
		nodes[n.ID] = n
	}
	for _, s := range snaps {
		n := LineageNode{ID: s.ID, Kind: "snapshot", ParentID: s.ParentID, CreatedAt: s.CreatedAt, Label: s.Label}
		// A sandbox's first snapshot hangs off the sandbox; a later one off the previous one,
		// unless that is of another sandbox (the one this sandbox was made from).
		if n.ParentID == "" || snapshotSandbox(snaps, n.ParentID) != s.SandboxID {
			n.ParentID = s.SandboxID
		}
		nodes[n.ID] = n
		if _, ok := nodes[s.SandboxID]; !ok {
			nodes[s.SandboxID] = LineageNode{ID: s.SandboxID, Kind: "sandbox", CreatedAt: s.CreatedAt, State: string(StateDeleted)}
		}
	}
	// The connected part around id.
	adj := map[string][]string{}
	for _, n := range nodes {
		if n.ParentID != "" {
			adj[n.ID] = append(adj[n.ID], n.ParentID)
			adj[n.ParentID] = append(adj[n.ParentID], n.ID)
		}
	}
	seen := map[string]bool{id: true}
	queue := []string{id}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, nb := range adj[cur] {
			if !seen[nb] {
				seen[nb] = true
				queue = append(queue, nb)
			}
		}
	}
	out := make([]LineageNode, 0, len(seen))
	for nid := range seen {
		if n, ok := nodes[nid]; ok {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func snapshotSandbox(snaps []store.Snapshot, sid string) string {
	for _, s := range snaps {
		if s.ID == sid {
			return s.SandboxID
		}
	}
	return ""
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
	var mfs [2]*manifest
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
	if mfs[0].Spec.RootFS != mfs[1].Spec.RootFS || fmt.Sprint(mfs[0].Spec.Layers) != fmt.Sprint(mfs[1].Spec.Layers) {
		return nil, errdefs.InvalidArgument("the two snapshots are of different templates; a file-level diff compares snapshots of one template")
	}
	lower := fstree.NewView(lowerLayers(mfs[1])...)
	inLower := func(p string) bool {
		_, ok, err := lower.Lookup(p)
		return ok && err == nil
	}
	out := fstree.Diff(mfs[0].Upper, mfs[1].Upper, inLower)
	if out == nil {
		out = []fstree.Change{}
	}
	return out, nil
}
