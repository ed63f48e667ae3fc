package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/network"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store"
)

// SlotPool hands out network slots; network.Pool implements it.
type SlotPool interface {
	Acquire(ctx context.Context) (*network.Slot, error)
	Adopt(ctx context.Context, index int) (*network.Slot, error)
	Release(ctx context.Context, s *network.Slot) error
	// InUse lists the lease indexes of slots in use, including ones left by an earlier run.
	InUse() []int
}

// Credentials checks and opens the credential secrets sandboxes name in network.credentials;
// credentials.Vault (internal/egress/credentials) implements it. Safe for concurrent use.
type Credentials interface {
	// Check returns an error wrapping errdefs.ErrInvalidArgument unless every name is one of
	// tenant's secrets.
	Check(ctx context.Context, tenant string, names []string) error
	// Open returns the named secrets of tenant that (still) exist, for the egress gateway.
	Open(tenant string, names []string) []egress.Credential
}

// Audit is the egress gateway's record of its decisions; *egress.Audit implements it. Safe for
// concurrent use.
type Audit interface {
	Events(id string) []egress.Event                   // a sandbox's recent decisions
	Subscribe(id string) (<-chan egress.Event, func()) // its decisions from now on, until cancel
	Forget(id string)                                  // drop what is kept of a deleted sandbox
	Counts() map[string]int64                          // decisions so far, by decision
}

// Template is what a sandbox is made from: read-only filesystem layers and the defaults its
// image asks for, which apply to every command in the sandbox.
type Template struct {
	RootFS     string            // bottom layer
	Layers     []string          // layers over RootFS, bottom to top
	Env        map[string]string // environment of every command (under the sandbox's own)
	WorkingDir string            // default working directory of commands
	User       string            // default user of commands
	Start      *Service          // a service every sandbox of the template runs from its start
}

// Service is a process a template's sandboxes run from their start (the code interpreter's
// server), and how to tell it is ready: a GET of ReadyPath on ReadyPort answering 200. A create
// returns once it is ready.
type Service struct {
	Command    []string          `json:"command"`
	User       string            `json:"user,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	ReadyPort  int               `json:"ready_port"`
	ReadyPath  string            `json:"ready_path"`
}

// TemplateFunc resolves a template by name, building it if needed. An unknown name yields an
// error wrapping errdefs.ErrNotFound.
type TemplateFunc func(ctx context.Context, name string) (Template, error)

// Config holds the Manager's dependencies and tuning.
type Config struct {
	Store          store.Store
	Drivers        map[string]runtime.Driver // by name
	DefaultRuntime string
	Slots          SlotPool
	Templates      TemplateFunc
	AgentPath      string
	Logger         *slog.Logger

	DefaultTemplate string
	DefaultTimeout  time.Duration
	MaxTimeout      time.Duration
	MaxPerTenant    int
	DefaultEgress   string
	ReapInterval    time.Duration // how often expiry is checked (default 1s)
	HealthInterval  time.Duration // how often runtimes are checked for crashes (default 10s)
	// BackgroundJobs bounds the expiry, health and snapshot jobs running at once, each on one
	// sandbox (default 4).
	BackgroundJobs int
	ReadyTimeout   time.Duration // how long create waits for the agent (default 30s)
	WarmPool       int           // sandboxes of the default shape kept started ahead of demand
	// WarmTemplates sizes the warm pools of other templates (default shape, that template).
	WarmTemplates map[string]int
	StateDir      string          // where paused sandboxes' checkpoints live (pause needs it)
	Chunks        snapshot.Chunks // where snapshots live (snapshots need it and StateDir)
	Audit         Audit           // egress decisions of the gateway (optional)
	EgressCA      []byte          // PEM of the gateway's interception CA, trusted in every sandbox
	Credentials   Credentials     // tenants' credential secrets (optional: no secrets without it)
	// TemplateRefs keeps what sandboxes and snapshots stand on from template rebuilds
	// (optional); Instance names this instance's holders in it.
	TemplateRefs TemplateRefs
	Instance     string
	// Crash, for the crash-point tests only, kills spaced at one named step (nil: never).
	Crash *crashpoint.Hook
	// Capacity reports the most the host can give one sandbox; creates that ask for more are
	// refused. Nil: no check.
	Capacity func() (Capacity, error)

	// AgentURL maps a slot to the agent's base URL. Default http://<guest ip>:49983. Tests that
	// run a fake driver override it.
	AgentURL func(s *network.Slot) string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Manager owns every sandbox of this spaced instance.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	events broker

	mu      sync.Mutex
	boxes   map[string]*box
	pending map[string]int    // per tenant: creates admitted by the quota, not yet registered
	warm    map[string][]*box // ready pool members by template, not in boxes (see warm.go)
	pinned  map[string]int    // shared layers being set up (see layers.go)
	closing bool
	busy    map[string]bool // background jobs running, by kind/sandbox (reaper.go)

	snaps *snapshot.Store // snapshots' content (nil without Chunks)

	layerMu sync.Mutex // serialises making and removing shared layers

	// bg ends when Close begins: waits of background work (a warm sandbox waiting for its
	// template to be built) stop there, and nothing new starts.
	bg       context.Context
	bgCancel context.CancelFunc

	refillc chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
}

// box is the in-memory side of one sandbox. Its mutex serialises lifecycle operations on it; rec
// is the persisted truth; its State changes only through setState.
type box struct {
	id, tenant string // immutable copies of rec's, readable without mu

	mu   sync.Mutex
	rec  store.Sandbox
	hc   *http.Client
	spec Spec
	slot *network.Slot
	// slotAddr is the slot's guest address, readable without mu (egress lookups).
	slotAddr atomic.Pointer[netip.Addr]
	client   *agent.Client
	// view is the sandbox as the API shows it, refreshed (under mu) whenever rec changes, so
	// that reads never wait for a create or delete in progress.
	view atomic.Pointer[Info]
	// life ends when the sandbox's runtime goes away (teardown): streams to its agent follow it,
	// so a crashed sandbox fails its callers at once instead of leaving them to TCP timeouts.
	life context.Context
	end  context.CancelCauseFunc
}

// setClient connects b to its agent and starts its life. The caller holds b.mu.
func (m *Manager) setClient(b *box) {
	b.hc = m.newHTTPClient()
	b.client = agent.NewClient(m.cfg.AgentURL(b.slot), b.rec.AccessToken, b.hc)
	b.life, b.end = context.WithCancelCause(context.Background())
}

// New returns a Manager. Call Recover before serving and Close on shutdown.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Slots == nil || cfg.Templates == nil || len(cfg.Drivers) == 0 {
		return nil, fmt.Errorf("sandbox manager: store, slots, templates and a driver are required")
	}
	if _, ok := cfg.Drivers[cfg.DefaultRuntime]; !ok {
		return nil, fmt.Errorf("sandbox manager: default runtime %q is not configured", cfg.DefaultRuntime)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DefaultTemplate == "" {
		cfg.DefaultTemplate = "minimal"
	}
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = 300 * time.Second
	}
	if cfg.MaxTimeout == 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	if cfg.MaxPerTenant == 0 {
		cfg.MaxPerTenant = 100
	}
	if cfg.DefaultEgress == "" {
		cfg.DefaultEgress = "deny"
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = 10 * time.Second
	}
	if cfg.BackgroundJobs == 0 {
		cfg.BackgroundJobs = 4
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.AgentURL == nil {
		cfg.AgentURL = func(s *network.Slot) string {
			return fmt.Sprintf("http://%s", netip.AddrPortFrom(s.GuestIP.Addr(), runtime.AgentPort))
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	bg, bgCancel := context.WithCancel(context.Background())
	m := &Manager{cfg: cfg, log: cfg.Logger, boxes: map[string]*box{}, pending: map[string]int{}, pinned: map[string]int{}, busy: map[string]bool{},
		bg: bg, bgCancel: bgCancel, stop: make(chan struct{}), refillc: make(chan struct{}, 1), warm: map[string][]*box{}}
	if cfg.Chunks != nil {
		m.snaps = snapshot.New(cfg.Chunks, cfg.Store, cfg.Logger)
	}
	return m, nil
}

// Start launches the reaper and the warm pool. Recover should have run first.
func (m *Manager) Start() {
	m.wg.Add(3)
	go m.reaper()
	go m.filler()
	go m.autoSnapshots()
	m.refill()
}

// closeGrace is how long Close waits for background work and the warm pool's removal. What is
// still under way then is left as a crash would leave it: the next start's recovery finishes it.
const closeGrace = 800 * time.Millisecond

// Close stops background work and removes the warm pool, within closeGrace: from its first
// moment nothing new starts. Sandboxes keep running: they outlive spaced.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closing = true
	m.mu.Unlock()
	m.bgCancel()
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	deadline := time.Now().Add(closeGrace)
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		m.drainWarm(deadline)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Until(deadline)):
		m.log.Warn("shutting down with background work still under way; the next start finishes it")
	}
}

// Subscribe returns lifecycle events for tenant ("" for all tenants).
func (m *Manager) Subscribe(tenant string) *Subscription { return m.events.subscribe(tenant) }

func (m *Manager) publish(typ string, rec store.Sandbox, reason string) {
	m.events.publish(Event{Type: typ, SandboxID: rec.ID, Tenant: rec.Tenant, Time: m.cfg.Now().UTC(), Reason: reason})
}

// Runtimes reports each configured driver and whether this host can run it.
func (m *Manager) Runtimes(ctx context.Context) (list []RuntimeInfo, def string) {
	for name, d := range m.cfg.Drivers {
		ri := RuntimeInfo{Name: name, Available: true}
		if err := d.Available(ctx); err != nil {
			ri.Available, ri.Reason = false, err.Error()
		}
		list = append(list, ri)
	}
	return list, m.cfg.DefaultRuntime
}

// RuntimeInfo is one entry of /v1/info's runtimes.
type RuntimeInfo struct {
	Name      string
	Available bool
	Reason    string
}

var idRE = regexp.MustCompile(`^sbx_[0-9a-z]{20}$`)

// ValidID reports whether id has the form of a sandbox ID.
func ValidID(id string) bool { return idRE.MatchString(id) }

func newID(prefix string, n int) string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return prefix + string(b)
}

func newToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// lookup finds a live sandbox of tenant; others' sandboxes are not found.
func (m *Manager) lookup(tenant, id string) (*box, error) {
	if !ValidID(id) {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("%q is not a sandbox ID", id))
	}
	m.mu.Lock()
	b, ok := m.boxes[id]
	m.mu.Unlock()
	if !ok || (tenant != "" && b.tenant != tenant) {
		return nil, errdefs.NotFound(fmt.Sprintf("sandbox %s not found", id))
	}
	return b, nil
}

// setState moves b to state `to` through the guard and persists it before returning: the one
// writer of sandbox state (state.go). Deleted is persisted by removing the record. The caller
// holds b.mu (or owns b alone, before it is registered).
func (m *Manager) setState(ctx context.Context, b *box, to State, reason string) error {
	if err := checkTransition(State(b.rec.State), to); err != nil {
		return err
	}
	prev := b.rec
	b.rec.State = string(to)
	b.rec.Error = reason
	b.rec.UpdatedAt = m.cfg.Now().UTC()
	defer b.refresh()
	if to == StateDeleted {
		if err := m.cfg.Store.DeleteSandbox(ctx, b.rec.ID); err != nil {
			b.rec = prev
			return fmt.Errorf("delete record: %w", err)
		}
		m.releaseTemplates(b.rec.ID, b.spec.RootFS, b.spec.Layers)
		return nil
	}
	if err := m.cfg.Store.UpdateSandbox(ctx, b.rec); err != nil {
		b.rec = prev
		return fmt.Errorf("persist state %s: %w", to, err)
	}
	return nil
}

func (m *Manager) newHTTPClient() *http.Client {
	d := &net.Dialer{
		Timeout: 10 * time.Second,
		// A sandbox that vanishes sends no FIN: notice a dead peer in seconds, not minutes.
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3},
	}
	return &http.Client{Transport: &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

func encodeSpec(s Spec) json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // Spec holds only plain data
	}
	return b
}

// newBox returns an unregistered box for rec.
func newBox(rec store.Sandbox, spec Spec) *box {
	b := &box{id: rec.ID, tenant: rec.Tenant, rec: rec, spec: spec}
	b.refresh()
	return b
}

// refresh republishes b's view. The caller holds b.mu (or owns b alone).
func (b *box) refresh() {
	v := infoOf(b.rec, b.spec)
	b.view.Store(&v)
	if b.slot != nil {
		a := b.slot.GuestIP.Addr()
		b.slotAddr.Store(&a)
	} else {
		b.slotAddr.Store(nil)
	}
}

// crash is a step of an operation where the crash-point tests may kill spaced.
func (m *Manager) crash(step string) { m.cfg.Crash.At(step) }
