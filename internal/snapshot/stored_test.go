package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// TestStoredBytesIsNoCrossTenantOracle: two tenants snapshot the same random file; the second
// is charged as much as the first (the store keeps one copy, but stored_bytes must not say
// so), while a tenant's own repeat costs only its root.
func TestStoredBytesIsNoCrossTenantOracle(t *testing.T) {
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
	defer cs.Close()
	m := New(cs, st, nil)
	data := make([]byte, 4<<20)
	rand.Read(data)
	n := 0
	snapshot := func(tenant string) (stored, toStore int64) {
		n++
		id := fmt.Sprintf("snp_%020d", n)
		tx := cs.Begin()
		chunks, err := tx.PutBytes(data)
		if err != nil {
			t.Fatal(err)
		}
		var hashes []string
		for _, c := range chunks {
			hashes = append(hashes, c.Hash)
		}
		rootBytes, err := tx.Commit(id, json.RawMessage(`{}`), hashes)
		if err != nil {
			t.Fatal(err)
		}
		toStore = tx.Stored() + rootBytes
		if stored, err = m.StoredForTenant(ctx, tenant, id, rootBytes); err != nil {
			t.Fatal(err)
		}
		if err := st.CreateSnapshot(ctx, store.Snapshot{ID: id, Tenant: tenant, SandboxID: "sbx_x", Kind: KindFilesystem,
			CreatedAt: time.Now().Add(time.Duration(n) * time.Second), StoredBytes: stored}); err != nil {
			t.Fatal(err)
		}
		return stored, toStore
	}
	first, _ := snapshot("alice")
	if first < 4<<20 {
		t.Fatalf("alice's random 4 MiB stored as %d bytes", first)
	}
	second, newToStore := snapshot("bob")
	if newToStore > first/100 {
		t.Fatalf("the store did not deduplicate (%d new bytes); this test needs it to", newToStore)
	}
	if second < first-first/100 {
		t.Fatalf("bob's snapshot of the data alice holds reports %d stored bytes, alice's %d: an oracle", second, first)
	}
	again, _ := snapshot("bob")
	if again > first/100 {
		t.Fatalf("bob's own repeat reports %d stored bytes, want only its root", again)
	}
	// After a restart (nothing cached) bob's sets are rebuilt from his records.
	m = New(cs, st, nil)
	if repeat, _ := snapshot("bob"); repeat > first/100 {
		t.Fatalf("after a restart bob's repeat reports %d stored bytes", repeat)
	}
	if carol, _ := snapshot("carol"); carol < first-first/100 {
		t.Fatalf("after a restart carol's first copy reports %d stored bytes", carol)
	}
	t.Logf("alice %d, bob %d (store added %d), bob again %d", first, second, newToStore, again)
}
