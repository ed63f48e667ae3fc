package fake

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/runtime/runtimetest"
)

// harness gives the conformance suite fake drivers, loopback slots and file access through each
// sandbox's agent.
type harness struct {
	a, b    byte // 127.a.b.n: this run's loopback addresses
	seq     atomic.Int32
	hc      *http.Client
	mu      sync.Mutex
	drivers []*Driver
	roots   []string
}

func newHarness(t *testing.T) *harness {
	var ab [2]byte
	rand.Read(ab[:])
	h := &harness{a: ab[0]%200 + 20, b: ab[1], hc: &http.Client{Transport: &http.Transport{Proxy: nil}}}
	t.Cleanup(h.hc.CloseIdleConnections)
	return h
}

func (h *harness) newDriver(t *testing.T) runtime.Driver {
	root := t.TempDir()
	d := New(root)
	h.mu.Lock()
	h.drivers = append(h.drivers, d)
	h.roots = append(h.roots, root)
	h.mu.Unlock()
	t.Cleanup(func() {
		if ids, _ := d.List(context.Background()); len(ids) > 0 {
			t.Errorf("driver still has %v", ids)
		}
		if entries, _ := os.ReadDir(root); len(entries) > 0 {
			t.Errorf("driver left %d entries in its root", len(entries))
		}
	})
	return d
}

// newNetwork hands out a fresh loopback address; releasing it checks that nothing listens there.
func (h *harness) newNetwork(t *testing.T) (runtime.Network, func()) {
	n := h.seq.Add(1)
	addr := netip.AddrFrom4([4]byte{127, h.a, h.b, byte(n%250 + 2)})
	release := func() {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, runtime.AgentPort).String(), time.Second)
		if err == nil {
			c.Close()
			t.Errorf("something still listens at %s after its sandbox", addr)
		}
	}
	return runtime.Network{GuestIP: netip.PrefixFrom(addr, 32), Interface: "lo", Gateway: addr}, release
}

// find returns the driver and instance that hold sandbox id.
func (h *harness) find(id string) (*Driver, *instance, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.drivers {
		d.mu.Lock()
		inst, ok := d.boxes[id]
		d.mu.Unlock()
		if ok {
			return d, inst, nil
		}
	}
	return nil, nil, errdefs.NotFound("no driver has " + id)
}

// client is an agent client of sandbox id and the host path of its layer.
func (h *harness) client(id string) (*agent.Client, string, error) {
	_, inst, err := h.find(id)
	if err != nil {
		return nil, "", err
	}
	url := "http://" + netip.AddrPortFrom(inst.spec.Network.GuestIP.Addr(), runtime.AgentPort).String()
	return agent.NewClient(url, inst.currentToken(), h.hc), inst.layer(), nil
}

func (h *harness) writeFile(ctx context.Context, id, path string, data []byte) error {
	c, layer, err := h.client(id)
	if err != nil {
		return err
	}
	_, err = c.Upload(ctx, filepath.Join(layer, path), 0o644, "", bytes.NewReader(data))
	return err
}

func (h *harness) readFile(ctx context.Context, id, path string) ([]byte, error) {
	c, layer, err := h.client(id)
	if err != nil {
		return nil, err
	}
	rc, _, err := c.Download(ctx, filepath.Join(layer, path), "")
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func (h *harness) env(t *testing.T) runtimetest.Env {
	agentPath := filepath.Join(t.TempDir(), "space-agent") // checked, never run
	if err := os.WriteFile(agentPath, []byte("not run"), 0o755); err != nil {
		t.Fatal(err)
	}
	return runtimetest.Env{
		RootFS:     t.TempDir(),
		AgentPath:  agentPath,
		NewNetwork: h.newNetwork,
		WriteFile:  h.writeFile,
		ReadFile:   h.readFile,
		Pause: func(_ context.Context, id string) error {
			d, _, err := h.find(id)
			if err != nil {
				return err
			}
			return d.Pause(id)
		},
		Leftovers: func(t *testing.T, id string) []string {
			h.mu.Lock()
			defer h.mu.Unlock()
			var out []string
			for _, r := range h.roots {
				if _, err := os.Lstat(filepath.Join(r, id)); err == nil {
					out = append(out, "directory "+filepath.Join(r, id))
				}
			}
			return out
		},
	}
}

func TestConformance(t *testing.T) {
	h := newHarness(t)
	runtimetest.Run(t, h.newDriver, h.env(t))
}

// fixture is one running fake sandbox with an agent client.
type fixture struct {
	h    *harness
	d    *Driver
	spec runtime.Spec
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	h := newHarness(t)
	d := h.newDriver(t).(*Driver)
	netw, release := h.newNetwork(t)
	t.Cleanup(release)
	spec := runtime.Spec{ID: "fk-1", AgentToken: "tok", Network: netw}
	t.Cleanup(func() { d.Delete(context.Background(), spec.ID) })
	if err := d.Create(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	f := &fixture{h: h, d: d, spec: spec}
	f.ready(t)
	return f
}

func (f *fixture) ready(t *testing.T) {
	t.Helper()
	c, _, err := f.h.client(f.spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := c.Health(ctx); err != nil {
		t.Fatalf("agent health: %v", err)
	}
}

// TestPausedHoldsRequests: while a Freeze runs, the agent answers nothing; its answer comes
// once the sandbox goes on.
func TestPausedHoldsRequests(t *testing.T) {
	f := newFixture(t)
	inFreeze, release := make(chan struct{}), make(chan struct{})
	f.d.OnPause = func(ctx context.Context, op Op, id string) error {
		if op == OpFreeze {
			close(inFreeze)
			<-release
		}
		return nil
	}
	done := make(chan error, 1)
	go func() {
		done <- f.d.Freeze(t.Context(), f.spec.ID, func(string) error { return nil })
	}()
	<-inFreeze
	if st, _ := f.d.State(t.Context(), f.spec.ID); st != runtime.StatePaused {
		t.Errorf("State during Freeze = %s", st)
	}
	answered := make(chan error, 1)
	go func() { answered <- f.h.writeFile(context.Background(), f.spec.ID, "/root/held", []byte("x")) }()
	select {
	case err := <-answered:
		t.Fatalf("paused agent answered: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := os.Lstat(filepath.Join(f.d.root, f.spec.ID, "layer/root/held")); err == nil {
		t.Error("a request sent while paused was carried out")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("held request after the freeze: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("held request not answered after the freeze")
	}
	if st, _ := f.d.State(t.Context(), f.spec.ID); st != runtime.StateRunning {
		t.Errorf("State after Freeze = %s", st)
	}
}

// TestCheckpointFaults: OnPause errors and a full disk fail Checkpoint, leave dir empty and the
// sandbox running; a checkpoint in progress reports the sandbox paused.
func TestCheckpointFaults(t *testing.T) {
	f := newFixture(t)
	if err := f.h.writeFile(t.Context(), f.spec.ID, "/root/data", bytes.Repeat([]byte("d"), 4096)); err != nil {
		t.Fatal(err)
	}
	errHook := errors.New("hook failed")
	tests := []struct {
		name  string
		setup func()
		want  error
	}{
		{"hook error", func() {
			f.d.OnPause = func(_ context.Context, op Op, id string) error {
				if st, _ := f.d.State(context.Background(), id); op != OpCheckpoint || st != runtime.StatePaused {
					t.Errorf("OnPause(%s) with the sandbox %s", op, st)
				}
				return errHook
			}
		}, errHook},
		{"no space", func() { f.d.OnPause, f.d.CheckpointSpace = nil, 1024 }, syscall.ENOSPC},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.setup()
			dir := t.TempDir()
			err := f.d.Checkpoint(t.Context(), f.spec.ID, dir, runtime.CheckpointOptions{})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Checkpoint = %v, want %v", err, tt.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) > 0 {
				t.Errorf("failed checkpoint left %d entries", len(entries))
			}
			if st, _ := f.d.State(t.Context(), f.spec.ID); st != runtime.StateRunning {
				t.Errorf("State after a failed checkpoint = %s", st)
			}
			f.ready(t)
		})
	}
}

// TestCheckpointManifestLast: a checkpoint without LeaveRunning stops the
// sandbox and its processes; a half-written checkpoint (no manifest) is refused.
func TestCheckpointManifestLast(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	if err := f.d.Checkpoint(t.Context(), f.spec.ID, dir, runtime.CheckpointOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.d.State(t.Context(), f.spec.ID); st != runtime.StateStopped {
		t.Errorf("State after Checkpoint = %s, want stopped", st)
	}
	if err := f.d.Checkpoint(t.Context(), f.spec.ID, t.TempDir(), runtime.CheckpointOptions{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Checkpoint of a stopped sandbox: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, ManifestFile)); err != nil {
		t.Fatal(err)
	}
	netw, release := f.h.newNetwork(t)
	t.Cleanup(release)
	spec := runtime.Spec{ID: "fk-2", Network: netw}
	if err := f.d.Restore(t.Context(), spec, dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Restore of a checkpoint without manifest: %v", err)
	}
	if st, _ := f.d.State(t.Context(), spec.ID); st != runtime.StateUnknown {
		t.Errorf("State after a failed Restore = %s", st)
	}
}

// TestRestoreKeepsToken: a restored agent demands the token the checkpointed agent held (the
// last one it was given), not the restore spec's, as a real restore brings its memory back.
func TestRestoreKeepsToken(t *testing.T) {
	f := newFixture(t)
	c, _, err := f.h.client(f.spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Rotate(t.Context(), "rotated"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := f.d.Checkpoint(t.Context(), f.spec.ID, dir, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	netw, release := f.h.newNetwork(t)
	t.Cleanup(release)
	spec := runtime.Spec{ID: "fk-copy", AgentToken: "spec-token", Network: netw}
	t.Cleanup(func() { f.d.Delete(context.Background(), spec.ID) })
	if err := f.d.Restore(t.Context(), spec, dir); err != nil {
		t.Fatal(err)
	}
	url := "http://" + netip.AddrPortFrom(netw.GuestIP.Addr(), runtime.AgentPort).String()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := agent.NewClient(url, "rotated", f.h.hc).WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := agent.NewClient(url, "spec-token", f.h.hc).Rotate(ctx, "x"); err == nil {
		t.Error("the restored agent took the restore spec's token")
	}
	if err := agent.NewClient(url, "rotated", f.h.hc).Rotate(ctx, "mine"); err != nil {
		t.Errorf("the restored agent refused the checkpointed agent's token: %v", err)
	}
}
