// Package runtime defines the isolation boundary of SPACE: the Driver interface every sandbox
// runtime (gVisor today; Firecracker and QEMU microVMs later) implements, and a registry the
// binaries use to pick drivers by name. Nothing above this package may know which driver runs a
// sandbox. Drivers live in sub-packages and are registered by cmd/spaced; this package imports
// no driver.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"
)

// AgentPort is the TCP port the in-sandbox agent listens on.
const AgentPort = 49983

// Resources limits one sandbox. Zero values mean "driver default".
type Resources struct {
	VCPUs     int   // CPU quota in whole CPUs
	MemoryMiB int64 // memory limit
	DiskMiB   int64 // size of the writable layer: writes past it fail with ENOSPC inside
	Pids      int64 // process limit
}

// Network describes the slot a sandbox is attached to, as the driver needs it.
type Network struct {
	NetNSPath string       // path of the network namespace (e.g. /run/netns/space-ab12-3)
	Interface string       // interface inside the netns the sandbox uses (veth peer or tap)
	GuestIP   netip.Prefix // the sandbox's address and prefix, e.g. 10.211.0.2/30
	Gateway   netip.Addr   // the host side of the link
}

// Spec is everything a driver needs to start one sandbox.
type Spec struct {
	ID         string            // sandbox ID; unique on the host for this spaced instance
	RootFS     string            // template root filesystem directory; read-only, shared; never written
	Layers     []string          // further read-only template layers over RootFS, bottom to top (overlayfs semantics: whiteouts delete)
	AgentPath  string            // host path of the space-agent binary to run as the sandbox's init
	AgentToken string            // access token the agent demands on every call
	Env        map[string]string // environment of the agent (and so default env of commands)
	Hostname   string
	// CACert (PEM), if set, is trusted in the sandbox: at /etc/space/ca.crt, appended to the
	// system bundle (/etc/space/ca-bundle.crt, also over the distribution's bundle where there
	// is one). The egress gateway's interception CA.
	CACert    []byte
	Resources Resources
	Network   Network
}

// State is what a driver knows about one of its sandboxes.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"  // stopped with its state kept by the driver (optional ability)
	StateStopped State = "stopped" // the runtime is gone or exited; Delete still cleans up
	StateUnknown State = "unknown" // the driver has no record of this ID
)

// Driver runs sandboxes. A Driver keeps its per-sandbox state under the directory it was given at
// construction, so that sandboxes outlive a restart of spaced: after a restart, State and Delete
// work for IDs created by an earlier process.
//
// Lifecycle: Create → (running) → Delete. Create either leaves a running sandbox or, on error,
// removes everything it made (processes, mounts, files). Delete is idempotent and removes
// everything the driver made for the ID, whatever state it is in; it does not touch the network
// slot, which belongs to the caller.
//
// Concurrency: methods may be called concurrently for different IDs. The caller serialises calls
// for one ID.
type Driver interface {
	// Name is the registry name, e.g. "gvisor".
	Name() string
	// Available reports nil if this host can run the driver, else why not.
	Available(ctx context.Context) error
	// Create starts a sandbox from spec. It returns once the runtime is started; the agent may
	// still be starting (callers wait for it over the network).
	Create(ctx context.Context, spec Spec) error
	// State reports the state of a sandbox by ID (StateUnknown if the driver has no record).
	State(ctx context.Context, id string) (State, error)
	// Delete stops and removes the sandbox and everything the driver made for it.
	Delete(ctx context.Context, id string) error
	// List returns the IDs of all sandboxes this driver has state for (for re-adoption).
	List(ctx context.Context) ([]string, error)
}

// CheckpointOptions tune one checkpoint.
type CheckpointOptions struct {
	// LeaveRunning keeps the sandbox running afterwards (it is paused while it is saved, so that
	// memory and files are of one instant); otherwise it is stopped.
	LeaveRunning bool
	// Durable makes everything in dir reach the disk before Checkpoint returns; without it the
	// caller copies the checkpoint elsewhere (a fork, a snapshot) and dir is scratch.
	Durable bool
}

// Checkpointer is the optional ability to save a running sandbox's full state (memory, processes,
// files of its writable layer) into dir, and to start a sandbox from such a directory. One
// checkpoint may be restored many times, into new IDs and other network slots.
type Checkpointer interface {
	Checkpoint(ctx context.Context, id, dir string, opts CheckpointOptions) error
	Restore(ctx context.Context, spec Spec, dir string) error
}

// LayerExporter is the optional ability to hand over a sandbox's writable layer — the files it
// added or changed, with overlayfs whiteouts for what it deleted — as the directory dest (which
// must not exist), so that it can become a template layer. The sandbox is stopped first; the
// caller then Deletes it as usual.
type LayerExporter interface {
	ExportLayer(ctx context.Context, id, dest string) error
}

// LayerCapturer is the optional ability to look at a running sandbox's writable layer on the
// host: WritableLayer names the directory (which changes while the sandbox runs), and Freeze
// stops the sandbox's processes, calls fn with that directory and lets them go on, so that fn
// sees the files of one instant. Drivers whose file system is not on the host do not have it.
type LayerCapturer interface {
	WritableLayer(id string) (string, error)
	Freeze(ctx context.Context, id string, fn func(dir string) error) error
}

// Thawer is the optional ability to let a sandbox go on that a Freeze or a checkpoint left
// stopped (StatePaused) because the caller died before it could: after a crash of spaced in the
// middle of a file snapshot, a fork or a full snapshot, the sandbox is intact, only frozen.
type Thawer interface {
	Thaw(ctx context.Context, id string) error
}

// Prober is the optional ability to tell cheaply, without starting a process, whether a
// sandbox's runtime still runs: the health check asks it for every running sandbox every few
// seconds. Alive may answer true for a runtime the driver cannot vouch for only if State would;
// a false answer is confirmed with State before anything is done about it. Safe to call
// concurrently with any other method.
type Prober interface {
	Alive(ctx context.Context, id string) bool
}

// Usage is what a sandbox uses now.
type Usage struct {
	CPUSeconds  float64 // CPU time used since it started
	MemoryBytes int64   // memory in use
	MemoryLimit int64
	DiskBytes   int64 // its writable layer
}

// UsageReporter is the optional ability to report a running sandbox's resource usage.
type UsageReporter interface {
	Usage(ctx context.Context, id string) (Usage, error)
}

// Factory builds a driver whose per-sandbox state lives under stateDir.
type Factory func(stateDir string, cfg map[string]string) (Driver, error)

// Registry maps driver names to factories. The zero value is ready to use.
type Registry struct {
	mu        sync.Mutex
	factories map[string]Factory
}

// Register adds a factory under name; registering a name twice is an error.
func (r *Registry) Register(name string, f Factory) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.factories == nil {
		r.factories = map[string]Factory{}
	}
	if _, ok := r.factories[name]; ok {
		return fmt.Errorf("runtime %q registered twice", name)
	}
	r.factories[name] = f
	return nil
}

// Lookup returns the factory registered under name.
func (r *Registry) Lookup(name string) (Factory, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.factories[name]
	if !ok {
		return nil, fmt.Errorf("runtime %q: %w", name, ErrUnknownRuntime)
	}
	return f, nil
}

// Names lists registered drivers, sorted.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for n := range r.factories {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ErrUnknownRuntime is returned by Lookup for a name nobody registered.
var ErrUnknownRuntime = errors.New("unknown runtime")
