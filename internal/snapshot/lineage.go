package snapshot

import (
	"sort"
	"time"

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

// Lineage returns the tree sandbox id belongs to: every sandbox (of sandboxes, the tenant's
// live ones, whose Kind is "sandbox") and snapshot (of snaps, the tenant's) connected to it
// through parents (a snapshot's parent is its sandbox's previous snapshot, or the sandbox; a
// sandbox's is the snapshot or sandbox it was made from), oldest first. A sandbox known only
// from its snapshots is in state "deleted".
func Lineage(id string, sandboxes []LineageNode, snaps []store.Snapshot) []LineageNode {
	nodes := map[string]LineageNode{}
	for _, n := range sandboxes {
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
			nodes[s.SandboxID] = LineageNode{ID: s.SandboxID, Kind: "sandbox", CreatedAt: s.CreatedAt, State: "deleted"}
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
	return out
}

func snapshotSandbox(snaps []store.Snapshot, sid string) string {
	for _, s := range snaps {
		if s.ID == sid {
			return s.SandboxID
		}
	}
	return ""
}
