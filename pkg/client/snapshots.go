package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Snapshot kinds.
const (
	SnapshotFilesystem = "filesystem"
	SnapshotFull       = "full"
)

// Snapshot is a saved state of a sandbox: its files (filesystem) or its whole running state (full).
type Snapshot struct {
	ID          string    `json:"id"`
	SandboxID   string    `json:"sandbox_id"`
	Kind        string    `json:"kind"`
	Label       string    `json:"label"`
	ParentID    string    `json:"parent_id"`
	CreatedAt   time.Time `json:"created_at"`
	SizeBytes   int64     `json:"size_bytes"`
	StoredBytes int64     `json:"stored_bytes"`
}

// LineageNode is a sandbox or snapshot in a lineage tree.
type LineageNode struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	ParentID  string    `json:"parent_id"`
	CreatedAt time.Time `json:"created_at"`
	State     string    `json:"state,omitempty"`
	Label     string    `json:"label,omitempty"`
}

// Change is one file that differs between two snapshots.
type Change struct {
	Path string `json:"path"`
	Op   string `json:"op"` // added, modified, deleted
	Size int64  `json:"size"`
}

func snapshotPath(sid, suffix string) string { return "/v1/snapshots/" + url.PathEscape(sid) + suffix }

// CreateSnapshot snapshots sandbox id; kind is SnapshotFilesystem (default) or SnapshotFull.
func (c *Client) CreateSnapshot(ctx context.Context, id, kind, label string) (*Snapshot, error) {
	body := struct {
		Kind  string `json:"kind,omitempty"`
		Label string `json:"label,omitempty"`
	}{kind, label}
	var s Snapshot
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/snapshots"), json: body}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSnapshots lists sandbox id's snapshots, oldest first; with id "" every snapshot of the tenant.
func (c *Client) ListSnapshots(ctx context.Context, id string) ([]Snapshot, error) {
	p := "/v1/snapshots"
	if id != "" {
		p = sandboxPath(id, "/snapshots")
	}
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: p}, &out); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// GetSnapshot returns snapshot sid.
func (c *Client) GetSnapshot(ctx context.Context, sid string) (*Snapshot, error) {
	var s Snapshot
	if err := c.do(ctx, request{method: http.MethodGet, path: snapshotPath(sid, "")}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot deletes snapshot sid.
func (c *Client) DeleteSnapshot(ctx context.Context, sid string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: snapshotPath(sid, "")}, nil)
}

// Restore returns sandbox id to snapshot sid: only paths (while its processes keep running) or,
// with no paths, the whole sandbox.
func (c *Client) Restore(ctx context.Context, id, sid string, paths ...string) (*Sandbox, error) {
	body := struct {
		SnapshotID string   `json:"snapshot_id"`
		Paths      []string `json:"paths,omitempty"`
	}{sid, paths}
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/restore"), json: body}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Lineage returns the tree of sandboxes and snapshots sandbox id belongs to, oldest first.
func (c *Client) Lineage(ctx context.Context, id string) ([]LineageNode, error) {
	var out struct {
		Nodes []LineageNode `json:"nodes"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/lineage")}, &out); err != nil {
		return nil, err
	}
	return out.Nodes, nil
}

// Diff lists the files that changed from snapshot against to snapshot sid.
func (c *Client) Diff(ctx context.Context, sid, against string) ([]Change, error) {
	var out struct {
		Changes []Change `json:"changes"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: snapshotPath(sid, "/diff"), query: url.Values{"against": {against}}}, &out); err != nil {
		return nil, err
	}
	return out.Changes, nil
}
