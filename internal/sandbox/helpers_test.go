package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/fstree"
	"github.com/space-sandbox/space/internal/network/looppool"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/runtime/fake"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

// edge is one state change seen by the store.
type edge struct{ from, to State }

// recordingStore is the real store that also records every state change written to it: the
// state a record had before each update, and deleted for each removal.
type recordingStore struct {
	store.Store
	mu    sync.Mutex
	edges map[edge]int
}

func (s *recordingStore) note(ctx context.Context, id string, to State) {
	prev, err := s.Store.GetSandbox(ctx, id)
	if err != nil || State(prev.State) == to {
		return
	}
	s.mu.Lock()
	s.edges[edge{State(prev.State), to}]++
	s.mu.Unlock()
}

func (s *recordingStore) UpdateSandbox(ctx context.Context, rec store.Sandbox) error {
	s.note(ctx, rec.ID, State(rec.State))
	return s.Store.UpdateSandbox(ctx, rec)
}

func (s *recordingStore) DeleteSandbox(ctx context.Context, id string) error {
	s.note(ctx, id, StateDeleted)
	return s.Store.DeleteSandbox(ctx, id)
}

func (s *recordingStore) seen() map[edge]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[edge]int{}
	for e, n := range s.edges {
		out[e] = n
	}
	return out
}

// bareDriver is a driver with none of the optional abilities: the fake with them hidden.
type bareDriver struct{ runtime.Driver }

// testEnv is a Manager on the fake driver (runtime "fake", the default, and "bare", another fake
// without its optional abilities), a loopback slot pool, a real store (recording state changes),
// a real chunk store and a clock tests can move on.
type testEnv struct {
	t        *testing.T
	dir      string
	drv      *fake.Driver
	bare     *fake.Driver
	skew     atomic.Int64 // how far the manager's clock is ahead of time.Now, in nanoseconds
	pool     *looppool.Pool
	st       *recordingStore
	raw      store.Store
	chunks   *cas.Store
	cfg      Config
	m        *Manager
	stateDir string
}

func newTestEnv(t *testing.T, tweak ...func(*Config)) *testEnv {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	raw, err := sqlite.Open(ctx, filepath.Join(dir, "space.db"), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	chunks, err := cas.Open(filepath.Join(dir, "store"), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { chunks.Close() })
	e := &testEnv{t: t, dir: dir, drv: fake.New(t.TempDir()), bare: fake.New(t.TempDir()), pool: looppool.New(), raw: raw, chunks: chunks,
		st: &recordingStore{Store: raw, edges: map[edge]int{}}, stateDir: filepath.Join(dir, "state")}
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(e.stateDir, 0o700); err != nil { // spaced's home, which exists
		t.Fatal(err)
	}
	e.cfg = Config{
		Store: e.st, Drivers: map[string]runtime.Driver{"fake": e.drv, "bare": bareDriver{e.bare}}, DefaultRuntime: "fake",
		Slots: e.pool, Logger: log, ReapInterval: 20 * time.Millisecond, ReadyTimeout: 5 * time.Second,
		HealthInterval: time.Hour, StateDir: e.stateDir, Chunks: chunks, Now: e.now,
		Templates: func(_ context.Context, name string) (Template, error) {
			if name == "minimal" {
				return Template{RootFS: rootfs}, nil
			}
			return Template{}, errdefs.NotFound("template " + name + " not found")
		},
	}
	for _, f := range tweak {
		f(&e.cfg)
	}
	e.m = e.start()
	t.Cleanup(func() {
		e.m.Close()
		for _, d := range []*fake.Driver{e.drv, e.bare} {
			ids, _ := d.List(ctx)
			for _, id := range ids {
				d.Delete(ctx, id)
			}
		}
	})
	return e
}

// now is the manager's clock: time.Now moved on by advance.
func (e *testEnv) now() time.Time { return time.Now().Add(time.Duration(e.skew.Load())) }

// advance moves the manager's clock on by d (for expiry).
func (e *testEnv) advance(d time.Duration) { e.skew.Add(int64(d)) }

// start makes a Manager on e's dependencies and recovers.
func (e *testEnv) start() *Manager {
	e.t.Helper()
	m, err := New(e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := m.Recover(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	return m
}

// restart is a restart of spaced: a new Manager on the same store, driver and pool.
func (e *testEnv) restart() {
	e.t.Helper()
	e.m.Close()
	e.m = e.start()
}

// runtimes lists the sandboxes of both drivers.
func (e *testEnv) runtimes() []string {
	ids, _ := e.drv.List(context.Background())
	bare, _ := e.bare.List(context.Background())
	return append(ids, bare...)
}

func (e *testEnv) create(tenant string) Info {
	e.t.Helper()
	info, err := e.m.Create(context.Background(), tenant, CreateRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

func (e *testEnv) state(tenant, id string) State {
	e.t.Helper()
	info, err := e.m.Get(context.Background(), tenant, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return StateDeleted
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State
}

// setRecord rewrites a sandbox's record in the store behind the manager's back, as a crash of
// spaced in the middle of an operation leaves it.
func (e *testEnv) setRecord(id string, st State) {
	e.t.Helper()
	ctx := context.Background()
	rec, err := e.raw.GetSandbox(ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	rec.State = string(st)
	if err := e.raw.UpdateSandbox(ctx, rec); err != nil {
		e.t.Fatal(err)
	}
}

// crashInPause leaves running sandbox id as a crash of spaced in the middle of a pause does once
// the driver's checkpoint is on disk: its record pausing, the runtime stopped at its (durable)
// checkpoint, its slot still recorded, and, with marked, the checkpoint marked whole (a crash
// between marking it and removing the runtime). Without marked it is a crash between the
// checkpoint and its mark.
func (e *testEnv) crashInPause(id string, marked bool) {
	e.t.Helper()
	e.setRecord(id, StatePausing)
	dir := e.m.checkpointDir(id)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		e.t.Fatal(err)
	}
	if err := e.drv.Checkpoint(context.Background(), id, dir, runtime.CheckpointOptions{Durable: true}); err != nil {
		e.t.Fatal(err)
	}
	if marked {
		if err := e.m.markCheckpoint(id); err != nil {
			e.t.Fatal(err)
		}
	}
}

// hasCheckpointDir reports whether anything of id's checkpoint (directory or mark) is left.
func (e *testEnv) hasCheckpointDir(id string) bool {
	_, err := os.Lstat(e.m.checkpointDir(id))
	_, merr := os.Lstat(e.m.checkpointMark(id))
	return err == nil || merr == nil
}

// snapshotOfFiles records a snapshot of sandbox info made by hand (the fake driver cannot
// capture files): kind filesystem holds files of a directory; kind full also an image the
// runtime would restore.
func (e *testEnv) snapshotOfFiles(info Info, kind string, files map[string]string) string {
	e.t.Helper()
	src := e.t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(content), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	tx := e.chunks.Begin()
	defer tx.Abort()
	upper, err := fstree.Capture(tx, src, nil, time.Time{})
	if err != nil {
		e.t.Fatal(err)
	}
	spec := info.Spec
	spec.Parent = nil
	mf, err := snapshot.NewManifest(kind, info.ID, info.Template, info.Runtime, nil, encodeSpec(spec))
	if err != nil {
		e.t.Fatal(err)
	}
	mf.Upper = upper
	if kind == snapshot.KindFull {
		img := fstree.Tree{CapturedAt: upper.CapturedAt}
		mf.Checkpoint = &img
		mf.AgentToken = "token-in-memory"
	}
	id := newID("snp_", 20)
	if _, err := snapshot.New(e.chunks, e.raw, nil).Commit(tx, id, mf); err != nil {
		e.t.Fatal(err)
	}
	if err := e.raw.CreateSnapshot(context.Background(), store.Snapshot{ID: id, Tenant: info.Tenant, SandboxID: info.ID,
		Kind: kind, CreatedAt: time.Now().UTC()}); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// checkClean fails unless nothing of any sandbox is left: no runtime, slot, record.
func (e *testEnv) checkClean() {
	e.t.Helper()
	if ids := e.runtimes(); len(ids) != 0 {
		e.t.Errorf("runtimes left in the fake driver: %v", ids)
	}
	if in := e.pool.InUse(); len(in) != 0 {
		e.t.Errorf("slots left in use: %v", in)
	}
	recs, err := e.raw.ListSandboxes(context.Background(), store.SandboxFilter{})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(recs) != 0 {
		e.t.Errorf("records left: %d (first %s in %s)", len(recs), recs[0].ID, recs[0].State)
	}
}
