package snapshot

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// TestReconcileSnapshots: after a crash between writing a snapshot's content and its record (or
// between deleting the two), start-up leaves only whole snapshots: content with a record.
func TestReconcileSnapshots(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "space.db"), log)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cs, err := cas.Open(filepath.Join(dir, "store"), log)
	if err != nil {
		t.Fatal(err)
	}
	put := func(name string) {
		tx := cs.Begin()
		chunks, err := tx.PutBytes([]byte("content of " + name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Commit(name, json.RawMessage(`{}`), []string{chunks[0].Hash}); err != nil {
			t.Fatal(err)
		}
	}
	record := func(id string) {
		if err := st.CreateSnapshot(ctx, store.Snapshot{ID: id, Tenant: "t", SandboxID: "sbx_x", Kind: KindFilesystem, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	put("snp_contentonly")   // crashed before the record was written
	record("snp_recordonly") // its content lost (cannot happen by our write order, but handled)
	put("snp_whole")
	record("snp_whole")

	if err := New(cs, st, log).Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	roots, _ := cs.Roots()
	if len(roots) != 1 || roots[0] != "snp_whole" {
		t.Fatalf("roots after reconcile: %v", roots)
	}
	recs, _ := st.ListSnapshots(ctx, store.SnapshotFilter{})
	if len(recs) != 1 || recs[0].ID != "snp_whole" {
		t.Fatalf("records after reconcile: %+v", recs)
	}
	stats, _ := cs.Stats()
	if stats.Chunks != 1 {
		t.Fatalf("chunks after reconcile: %+v", stats)
	}
}
