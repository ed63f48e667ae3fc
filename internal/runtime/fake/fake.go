// Package fake is a runtime.Driver for unprivileged tests: a "sandbox" is the real agent server
// (agent/server) running in the test process, listening on the slot's guest address (a loopback
// address in tests) at the agent port. Commands it runs are host processes, so tests that use it
// must run harmless commands and use temporary paths. Only tests import it.
//
// It has every optional ability of package runtime, with these semantics:
//
//   - Writable layer. Each sandbox owns the directory <root>/<id>/layer, root being the
//     directory given to New. The agent serves the host's file system (agent/server has no root
//     directory for file operations), so the layer holds what tests put there: through the
//     agent, at that host path, or directly. WritableLayer names it; it is the sandbox's state
//     that Checkpoint, Restore and ExportLayer carry. Delete removes <root>/<id>.
//   - Paused (runtime.StatePaused). A paused sandbox's agent holds every connection, open or
//     new, without reading from or writing to it, and the processes the agent started get
//     SIGSTOP (SIGCONT when it goes on). A request whose handler already runs finishes its work;
//     its answer waits. Freeze keeps the sandbox paused while fn runs, Checkpoint while it saves,
//     and Pause (a test control) leaves it paused as a crash of spaced in the middle of a Freeze
//     would; Thaw ends that. Pauses nest; Thaw ends them all.
//   - Checkpoint copies the layer into dir/upper (through confine) and writes the manifest
//     dir/fake-checkpoint.json last, so that a directory without it is a half-written
//     checkpoint; with Durable both are fsynced and the manifest is renamed into place. Without
//     LeaveRunning the sandbox is stopped afterwards (StateStopped until Delete). A failed
//     Checkpoint empties dir and leaves the sandbox running. Processes are not saved: Restore
//     starts a new agent for spec.ID, in spec's slot, over a copy of the checkpoint's layer; no
//     process of the checkpointed sandbox runs in it.
//   - Access token. The agent's token is part of its memory: the manifest records the token
//     the agent holds at the checkpoint (spec.AgentToken, or the last one it was given through
//     POST /init), and Restore starts the new agent with that token, not spec.AgentToken, as a
//     real restore brings the checkpointed agent back (the caller rotates it).
//   - ExportLayer stops the sandbox and moves its layer to dest. The fake has no template view,
//     so a layer holds no whiteouts unless a test made them.
//   - Usage measures the layer (DiskBytes) and reports the spec's memory limit (default
//     DefaultMemoryMiB). CPU and memory in use are not measured and are 0 (MemoryInUse, if
//     set, gives the latter): the agent's processes are children of the test process, shared
//     by every sandbox.
//
// Create and Restore check the spec paths they do not use when set (RootFS a directory,
// AgentPath a regular file, Network.NetNSPath existing), so that a spec a real driver refuses
// fails here too. The fake's state lives in its process: a Driver made later on the same root
// knows no sandbox. Fault hooks (FailCreate, Delay, OnPause, CheckpointSpace, MemoryInUse) let
// tests make operations fail or take long.
package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/agent/server"
	"github.com/space-sandbox/space/internal/confine"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// DefaultMemoryMiB is the memory limit Usage reports for a spec without one.
const DefaultMemoryMiB = 2048

// Op names the operation an OnPause hook is called from.
type Op string

// Operations that pause a sandbox.
const (
	OpFreeze     Op = "freeze"
	OpCheckpoint Op = "checkpoint"
)

// Driver runs in-process agents. The zero value is not usable; call New. Set the hooks before
// the first call.
type Driver struct {
	root     string
	mu       sync.Mutex
	boxes    map[string]*instance
	starting map[string]bool // IDs a Create or Restore is making
	// FailCreate, if set, makes Create and Restore fail for IDs it returns true for.
	FailCreate func(id string) bool
	// Unavailable, if set, is returned by Available.
	Unavailable error
	// Delay, if set, is how long Create and Restore take.
	Delay time.Duration
	// OnPause, if set, is called inside Freeze (before fn) and Checkpoint (before saving) while
	// the sandbox is paused. It may block, to make the operation long (tests race other calls
	// against it; ctx is the operation's), and an error from it fails the operation as a
	// failure of the real step would: the sandbox goes on running and dir is emptied.
	OnPause func(ctx context.Context, op Op, id string) error
	// CheckpointSpace, if positive, is how many bytes of layer a checkpoint may write: a larger
	// layer fails Checkpoint with an error wrapping syscall.ENOSPC, as a full disk would.
	CheckpointSpace int64
	// Agent, if set, is served in the agent's place, given the real agent's handler: what a
	// sandbox that replaced its agent with a server of its own answers.
	Agent func(agent http.Handler) http.Handler
	// MemoryInUse, if set, is the memory Usage reports in use by sandbox id (MemoryBytes), so
	// that a test can make a sandbox look too big for the disk a checkpoint would go to.
	MemoryInUse func(id string) int64
}

type instance struct {
	spec   runtime.Spec
	dir    string // <root>/<id>: layer/ and nothing else
	srv    *server.Server
	gate   *gate
	cancel context.CancelFunc
	done   chan struct{}
	dead   bool
	paused int                    // pauses in force (Freeze, Checkpoint, Pause); guarded by Driver.mu
	token  atomic.Pointer[string] // the token the agent demands now (see tokenWatch)
}

// currentToken is the token the agent demands now: its start token or the last it was given.
func (i *instance) currentToken() string { return *i.token.Load() }

// New returns an empty Driver whose sandboxes keep their layers under root (an existing
// directory, such as t.TempDir()).
func New(root string) *Driver {
	return &Driver{root: root, boxes: map[string]*instance{}, starting: map[string]bool{}}
}

// Name implements runtime.Driver.
func (d *Driver) Name() string { return "fake" }

// Available implements runtime.Driver.
func (d *Driver) Available(context.Context) error { return d.Unavailable }

// Create implements runtime.Driver.
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) error {
	return d.start(ctx, spec, "", spec.AgentToken)
}

var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func validateSpec(spec runtime.Spec) error {
	if !validID.MatchString(spec.ID) {
		return errdefs.InvalidArgument(fmt.Sprintf("fake: invalid sandbox ID %q", spec.ID))
	}
	if spec.RootFS != "" {
		if st, err := os.Stat(spec.RootFS); err != nil || !st.IsDir() {
			return errdefs.InvalidArgument(fmt.Sprintf("fake: rootfs %q is not a directory", spec.RootFS))
		}
	}
	if spec.AgentPath != "" {
		if st, err := os.Stat(spec.AgentPath); err != nil || !st.Mode().IsRegular() {
			return errdefs.InvalidArgument(fmt.Sprintf("fake: agent %q is not a regular file", spec.AgentPath))
		}
	}
	r := spec.Resources
	if r.VCPUs < 0 || r.MemoryMiB < 0 || r.Pids < 0 || r.DiskMiB < 0 {
		return errdefs.InvalidArgument("fake: negative resource limit")
	}
	return nil
}

// start makes sandbox spec.ID, its layer a copy of from if set, else empty, its agent demanding
// token.
func (d *Driver) start(ctx context.Context, spec runtime.Spec, from, token string) (err error) {
	if d.Delay > 0 {
		select {
		case <-time.After(d.Delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if d.FailCreate != nil && d.FailCreate(spec.ID) {
		return errors.New("fake: create failed as asked")
	}
	if err := validateSpec(spec); err != nil {
		return err
	}
	d.mu.Lock()
	if _, ok := d.boxes[spec.ID]; ok || d.starting[spec.ID] {
		d.mu.Unlock()
		return errdefs.New(errdefs.ErrAlreadyExists, fmt.Sprintf("fake: sandbox %s exists", spec.ID))
	}
	d.starting[spec.ID] = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.starting, spec.ID)
		d.mu.Unlock()
	}()

	if p := spec.Network.NetNSPath; p != "" {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("fake: create %s: network namespace: %w", spec.ID, err)
		}
	}
	inst := &instance{spec: spec, dir: filepath.Join(d.root, spec.ID), gate: newGate(), done: make(chan struct{})}
	inst.token.Store(&token)
	if err := os.Mkdir(inst.dir, 0o700); err != nil {
		return fmt.Errorf("fake: create %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(inst.dir)
		}
	}()
	if err := os.Mkdir(inst.layer(), 0o755); err != nil {
		return fmt.Errorf("fake: create %s: %w", spec.ID, err)
	}
	if from != "" {
		if err := copyTree(from, inst.layer()); err != nil {
			return fmt.Errorf("fake: restore %s: %w", spec.ID, err)
		}
	}
	env := []string{"PATH=" + server.DefaultPath}
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	srv, err := server.New(server.Config{Token: token, BaseEnv: env})
	if err != nil {
		return err
	}
	addr := netip.AddrPortFrom(spec.Network.GuestIP.Addr(), runtime.AgentPort)
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		srv.Close()
		return fmt.Errorf("fake: listen %s: %w", addr, err)
	}
	inst.srv = srv
	sctx, cancel := context.WithCancel(context.Background())
	inst.cancel = cancel
	go func() {
		defer close(inst.done)
		h := inst.tokenWatch(srv.Handler())
		if d.Agent != nil {
			h = d.Agent(h)
		}
		serve(sctx, h, &gatedListener{Listener: ln, gate: inst.gate})
	}()
	d.mu.Lock()
	d.boxes[spec.ID] = inst
	d.mu.Unlock()
	return nil
}

func (i *instance) layer() string { return filepath.Join(i.dir, "layer") }

// copyTree copies the contents of layer directory src into the existing directory dst.
func copyTree(src, dst string) error {
	s, err := confine.Open(src)
	if err != nil {
		return err
	}
	defer s.Close()
	t, err := confine.Open(dst)
	if err != nil {
		return err
	}
	defer t.Close()
	_, err = confine.CopyTree(s, t)
	return err
}

// lookup returns the instance of id, or ErrNotFound.
func (d *Driver) lookup(op, id string) (*instance, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	inst, ok := d.boxes[id]
	if !ok {
		return nil, fmt.Errorf("fake: %s %s: %w", op, id, errdefs.ErrNotFound)
	}
	return inst, nil
}

// Kill makes a sandbox's runtime die, as a crash would.
func (d *Driver) Kill(id string) {
	d.mu.Lock()
	inst, ok := d.boxes[id]
	d.mu.Unlock()
	if ok {
		d.stop(inst)
	}
}

// stop kills the agent's processes and the agent; the sandbox is then stopped.
func (d *Driver) stop(inst *instance) {
	d.mu.Lock()
	if inst.dead {
		d.mu.Unlock()
		return
	}
	inst.dead, inst.paused = true, 0
	d.mu.Unlock()
	inst.srv.SignalAll(syscall.SIGKILL)
	inst.srv.SignalAll(syscall.SIGCONT)
	inst.gate.open()
	inst.cancel()
	<-inst.done
	inst.srv.Close()
}

// State implements runtime.Driver.
func (d *Driver) State(_ context.Context, id string) (runtime.State, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	inst, ok := d.boxes[id]
	switch {
	case !ok:
		return runtime.StateUnknown, nil
	case inst.dead:
		return runtime.StateStopped, nil
	case inst.paused > 0:
		return runtime.StatePaused, nil
	}
	return runtime.StateRunning, nil
}

// Delete implements runtime.Driver.
func (d *Driver) Delete(_ context.Context, id string) error {
	d.mu.Lock()
	inst, ok := d.boxes[id]
	delete(d.boxes, id)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	d.stop(inst)
	if err := os.RemoveAll(inst.dir); err != nil {
		return fmt.Errorf("fake: delete %s: %w", id, err)
	}
	return nil
}

// List implements runtime.Driver.
func (d *Driver) List(context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.boxes))
	for id := range d.boxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// The abilities the fake has.
var (
	_ runtime.Driver        = (*Driver)(nil)
	_ runtime.Checkpointer  = (*Driver)(nil)
	_ runtime.LayerCapturer = (*Driver)(nil)
	_ runtime.LayerExporter = (*Driver)(nil)
	_ runtime.Thawer        = (*Driver)(nil)
	_ runtime.UsageReporter = (*Driver)(nil)
)
