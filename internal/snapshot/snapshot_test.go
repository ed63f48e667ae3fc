package snapshot

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// snapEnv is a chunk store and a record store in a temporary directory.
type snapEnv struct {
	t   *testing.T
	dir string
	cs  *cas.Store
	st  *sqlite.Store
	s   *Store
	n   int
}

func newSnapEnv(t *testing.T) *snapEnv {
	ctx := context.Background()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "space.db"), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cs, err := cas.Open(filepath.Join(dir, "store"), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return &snapEnv{t: t, dir: dir, cs: cs, st: st, s: New(cs, st, log)}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// take captures dir as a filesystem snapshot of tenant's sandbox on rootfs, records it and
// returns its ID and stored bytes.
func (e *snapEnv) take(tenant, dir, rootfs string) (string, int64) {
	e.t.Helper()
	e.n++
	spec, _ := json.Marshal(map[string]any{"resources": map[string]int{"cpus": 1}, "rootfs": rootfs})
	mf, err := NewManifest(KindFilesystem, "sbx_"+tenant, "base", "fake", nil, spec)
	if err != nil {
		e.t.Fatal(err)
	}
	tx := e.s.Begin()
	defer tx.Abort()
	if mf.Upper, err = Capture(tx, dir, nil); err != nil {
		e.t.Fatal(err)
	}
	id := fmt.Sprintf("snp_%020d", e.n)
	rootBytes, err := e.s.Commit(tx, id, mf)
	if err != nil {
		e.t.Fatal(err)
	}
	stored, err := e.s.StoredForTenant(context.Background(), tenant, id, rootBytes)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.st.CreateSnapshot(context.Background(), store.Snapshot{ID: id, Tenant: tenant, SandboxID: mf.SandboxID,
		Kind: KindFilesystem, Label: AutoLabel, CreatedAt: time.Now().Add(time.Duration(e.n) * time.Second),
		SizeBytes: mf.Size(), StoredBytes: stored}); err != nil {
		e.t.Fatal(err)
	}
	return id, stored
}

// TestCaptureReadDiffRestore: a directory captured into the chunk store reads back as the same
// manifest (its spec kept as given, its layers decoded); two snapshots diff to what changed
// between them (a file deleted from the layer but present in the template is "modified", not
// gone); the snapshot's files come back as a tar of chosen paths and as a whole layer; stored
// bytes count what is new to the tenant.
func TestCaptureReadDiffRestore(t *testing.T) {
	e := newSnapEnv(t)
	rootfs := filepath.Join(e.dir, "rootfs")
	writeFiles(t, rootfs, map[string]string{"etc/os": "template", "shadowed": "template's"})
	upper := filepath.Join(e.dir, "upper")
	writeFiles(t, upper, map[string]string{"a": "one", "dir/b": "two", "shadowed": "mine"})

	first, stored1 := e.take("alice", upper, rootfs)
	mf, err := e.s.Read(first)
	if err != nil {
		t.Fatal(err)
	}
	if mf.Kind != KindFilesystem || mf.RootFS != rootfs || len(mf.Layers) != 0 || mf.SandboxID != "sbx_alice" {
		t.Fatalf("manifest read back: %+v", mf)
	}
	var spec map[string]any
	if err := json.Unmarshal(mf.Spec, &spec); err != nil || spec["resources"] == nil {
		t.Fatalf("spec not kept whole: %s (%v)", mf.Spec, err)
	}
	if err := mf.CheckLayers(); err != nil {
		t.Fatal(err)
	}
	if stored1 < mf.Size() {
		t.Fatalf("first snapshot stored %d bytes, its files are %d", stored1, mf.Size())
	}

	noise := make([]byte, 64<<10)
	rand.Read(noise)
	writeFiles(t, upper, map[string]string{"a": "one, changed", "c": string(noise)})
	if err := os.Remove(filepath.Join(upper, "shadowed")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(upper, "dir")); err != nil {
		t.Fatal(err)
	}
	second, _ := e.take("alice", upper, rootfs)
	mf2, err := e.s.Read(second)
	if err != nil {
		t.Fatal(err)
	}
	changes, err := Diff(mf, mf2)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range changes {
		got[c.Path] = c.Op
	}
	want := map[string]string{"/a": "modified", "/c": "added", "/dir": "deleted", "/dir/b": "deleted", "/shadowed": "modified"}
	for p, op := range want {
		if got[p] != op {
			t.Errorf("diff: %s is %q, want %q (all: %v)", p, got[p], op, changes)
		}
	}
	if same, _ := Diff(mf2, mf2); len(same) != 0 {
		t.Errorf("a snapshot against itself: %v", same)
	}
	other := *mf2
	other.RootFS = filepath.Join(e.dir, "another")
	if _, err := Diff(mf, &other); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("diff across templates: %v, want invalid argument", err)
	}

	// The second snapshot's view of / by paths: its layer over the template.
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(e.s.WriteTar(pw, mf2, []string{"a", "shadowed", "etc"})) }()
	tr := tar.NewReader(pr)
	files := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			files[hdr.Name] = string(b)
		}
	}
	if files["a"] != "one, changed" || files["shadowed"] != "template's" || files["etc/os"] != "template" {
		t.Errorf("tar of the snapshot's paths: %v", files)
	}

	// The first snapshot's layer written back whole.
	layer := filepath.Join(e.dir, "layers", first)
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := e.s.WriteLayer(mf.Upper, filepath.Join(e.dir, "layers", ".tmp-x"), layer); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(layer, "dir", "b")); err != nil || string(b) != "two" {
		t.Errorf("layer written back: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "layers", ".tmp-x")); !os.IsNotExist(err) {
		t.Errorf("temporary layer directory left: %v", err)
	}

	// A repeat of unchanged files costs alice only its root; the same files are new to bob.
	_, again := e.take("alice", upper, rootfs)
	_, bobs := e.take("bob", upper, rootfs)
	if again > 4<<10 || bobs < mf2.Size() {
		t.Errorf("stored bytes: alice's repeat %d, bob's first %d, files %d", again, bobs, mf2.Size())
	}
	if !Unchanged(mf2, mf2.Upper) || Unchanged(mf, mf2.Upper) || Unchanged(nil, mf2.Upper) {
		t.Error("Unchanged does not tell equal files from changed ones")
	}

	// Automatic snapshots beyond the newest two, oldest first.
	list, err := e.st.ListSnapshots(context.Background(), store.SnapshotFilter{SandboxID: "sbx_alice"})
	if err != nil {
		t.Fatal(err)
	}
	var pruned []string
	for _, s := range Prune(list, 2) {
		pruned = append(pruned, s.ID)
	}
	if !slices.Equal(pruned, []string{first}) {
		t.Errorf("prune keeping 2 of %d: %v", len(list), pruned)
	}
	if p := Prune(list, 5); len(p) != 0 {
		t.Errorf("prune keeping 5 of %d: %v", len(list), p)
	}
}

// TestLineage: snapshots hang off their sandbox's previous snapshot, a sandbox off what it was
// made from; a deleted sandbox appears from its snapshots; unconnected trees are left out.
func TestLineage(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tm := func(n int) time.Time { return at.Add(time.Duration(n) * time.Minute) }
	snaps := []store.Snapshot{
		{ID: "snp_1", SandboxID: "sbx_gone", CreatedAt: tm(1)},
		{ID: "snp_2", SandboxID: "sbx_gone", ParentID: "snp_1", CreatedAt: tm(2)},
		{ID: "snp_3", SandboxID: "sbx_child", ParentID: "snp_2", CreatedAt: tm(4)},
		{ID: "snp_9", SandboxID: "sbx_other", CreatedAt: tm(5)},
	}
	boxes := []LineageNode{
		{ID: "sbx_child", Kind: "sandbox", ParentID: "snp_2", CreatedAt: tm(3), State: "running"},
		{ID: "sbx_other", Kind: "sandbox", CreatedAt: tm(0), State: "paused"},
	}
	got := Lineage("sbx_child", boxes, snaps)
	var ids, parents []string
	for _, n := range got {
		ids = append(ids, n.ID)
		parents = append(parents, n.ParentID)
	}
	if !slices.Equal(ids, []string{"sbx_gone", "snp_1", "snp_2", "sbx_child", "snp_3"}) {
		t.Fatalf("lineage: %v", ids)
	}
	if !slices.Equal(parents, []string{"", "sbx_gone", "snp_1", "snp_2", "sbx_child"}) {
		t.Errorf("parents: %v", parents)
	}
	if got[0].State != "deleted" || got[0].Kind != "sandbox" {
		t.Errorf("deleted sandbox: %+v", got[0])
	}
}
