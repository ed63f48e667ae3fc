// Package network owns the per-sandbox network slots of one spaced instance: a network namespace
// and a veth pair per slot, addresses leased host-wide so that several spaced instances never
// collide, and the nftables table that keeps every sandbox to "the host may reach its agent; it
// reaches nothing". Slots are pooled: a few are prepared ahead so Acquire is cheap; Release
// destroys a slot (a netns a sandbox ran in is never handed out again).
// Imported by the sandbox lifecycle and by cmd/spaced; it imports nothing of SPACE above it
// except errdefs.
package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
)

// Slot is one network slot: a netns with a veth pair whose peer sits in the host namespace.
type Slot struct {
	Index     int          // host-wide lease index
	NetNS     string       // netns name, e.g. "space-1a2b-7"
	NetNSPath string       // e.g. "/run/netns/space-1a2b-7"
	HostIf    string       // host-side veth name, e.g. "sp1a2bh7"
	GuestIf   string       // interface name inside the netns ("eth0")
	HostIP    netip.Addr   // address of HostIf (the sandbox's gateway)
	GuestIP   netip.Prefix // address and prefix of GuestIf
}

// Defaults applied by NewPool to zero Config fields.
const (
	DefaultLeaseDir = "/run/space/net"
	DefaultPoolSize = 4
)

// DefaultCIDR is the address range slots are carved from when Config.CIDR is zero.
var DefaultCIDR = netip.MustParsePrefix("10.211.0.0/16")

// netnsDir is where named network namespaces live (the iproute2 convention runsc and `ip netns`
// understand).
const netnsDir = "/run/netns"

// guestIfName is the name of the slot's interface inside its netns.
const guestIfName = "eth0"

var instanceRE = regexp.MustCompile(`^[0-9a-f]{4}$`)

// Config configures a Pool.
type Config struct {
	Instance string       // short instance id, 4 lowercase hex chars, unique per spaced (derived from SPACE_HOME by the caller)
	CIDR     netip.Prefix // address range slots are carved from as /30s; default 10.211.0.0/16
	LeaseDir string       // host-wide lease directory shared by all spaced instances; default /run/space/net
	// Gateway, if set, is where sandbox traffic out goes: TCP to its proxy port, DNS to its DNS
	// port (see nft.go). Without it sandboxes reach nothing.
	Gateway  *GatewayPorts
	PoolSize int // slots kept prepared ahead (0: default 4; negative: none, every Acquire builds)
	Logger   *slog.Logger
}

// withDefaults returns c with defaults filled in, or an error wrapping errdefs.ErrInvalidArgument.
func (c Config) withDefaults() (Config, error) {
	if !instanceRE.MatchString(c.Instance) {
		return c, fmt.Errorf("network: instance %q: want 4 lowercase hex characters: %w", c.Instance, errdefs.ErrInvalidArgument)
	}
	if !c.CIDR.IsValid() {
		c.CIDR = DefaultCIDR
	}
	if !c.CIDR.Addr().Is4() {
		return c, fmt.Errorf("network: cidr %s: want an IPv4 prefix: %w", c.CIDR, errdefs.ErrInvalidArgument)
	}
	// At least one /30; at most /8 so that indexes keep host veth names within IFNAMSIZ.
	if c.CIDR.Bits() > 30 || c.CIDR.Bits() < 8 {
		return c, fmt.Errorf("network: cidr %s: want a prefix length between /8 and /30: %w", c.CIDR, errdefs.ErrInvalidArgument)
	}
	c.CIDR = c.CIDR.Masked()
	if c.LeaseDir == "" {
		c.LeaseDir = DefaultLeaseDir
	}
	if c.PoolSize == 0 {
		c.PoolSize = DefaultPoolSize
	}
	if c.PoolSize < 0 {
		c.PoolSize = 0
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Pool hands out network slots of one spaced instance. All methods are safe for concurrent use.
//
// Lifecycle: NewPool installs the instance's nftables table and reclaims what a crashed earlier
// process of the same instance left behind, except slots that were in use: those stay for Adopt.
// Acquire hands out a slot, Release destroys it. Close destroys the prepared slots; in-use slots
// (and, while there are any, the nftables table that isolates them) survive it so that their
// sandboxes survive a restart of spaced. A slot's lease records whether it was handed out, so
// a restarted pool knows which slots to keep.
type Pool struct {
	cfg   Config
	log   *slog.Logger
	count int // number of /30s in cfg.CIDR

	mu       sync.Mutex
	free     []*Slot       // prepared, not handed out
	inUse    map[int]*Slot // handed out by this process (Acquire, Adopt)
	leftover map[int]*Slot // in use by an earlier process, not adopted yet
	next     int           // where the next lease search starts (round robin)
	closed   bool
	ops      sync.WaitGroup // Acquire and Adopt calls in flight; Close waits for them

	wake chan struct{} // asks the filler to top up the pool
	stop context.CancelFunc
	done chan struct{} // closed when the filler has returned
}

// NewPool sets up the instance's nftables table, reclaims stale state of this instance left by a
// crash (its netns, veths and leases, except slots that were in use), and starts filling the pool
// in the background. It refuses a CIDR that overlaps a route or address of the host that does
// not belong to a spaced slot leased in LeaseDir.
func NewPool(ctx context.Context, cfg Config) (*Pool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:      cfg,
		log:      cfg.Logger.With("instance", cfg.Instance),
		count:    1 << (30 - cfg.CIDR.Bits()),
		inUse:    make(map[int]*Slot),
		leftover: make(map[int]*Slot),
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	if err := ensureDirs(cfg.LeaseDir); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if err := p.checkHostConflicts(); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	// Rules first: slots left in use by an earlier process are isolated again before anything
	// else happens. Replacing the table is atomic, so they are never unprotected.
	if err := installRules(cfg.Instance, cfg.Gateway); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	// What cannot be removed now keeps its lease (so its addresses stay unused) and is tried
	// again at the next start; it does not stop this one.
	if err := p.reclaim(ctx); err != nil {
		p.log.WarnContext(ctx, "network: reclaim stale slots", "err", err)
	}
	fillCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p.stop = stop
	go p.fill(fillCtx)
	p.kick()
	p.log.InfoContext(ctx, "network pool ready", "cidr", cfg.CIDR, "lease_dir", cfg.LeaseDir,
		"pool_size", cfg.PoolSize, "left_in_use", len(p.leftover))
	return p, nil
}

// Acquire hands out a slot: a prepared one if there is one, else one built now. It fails with an
// error wrapping errdefs.ErrResourceExhausted when every address of the CIDR is leased.
func (p *Pool) Acquire(ctx context.Context) (*Slot, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("network: pool closed: %w", errdefs.ErrUnavailable)
	}
	p.ops.Add(1)
	defer p.ops.Done()
	var s *Slot
	if len(p.free) > 0 {
		s = p.free[0]
		p.free = p.free[1:]
	}
	p.mu.Unlock()
	// The filler is kicked when this returns, so it does not compete with a warm Acquire.
	defer p.kick()

	if s == nil {
		var err error
		if s, err = p.build(ctx); err != nil {
			return nil, fmt.Errorf("network: acquire: %w", err)
		}
	}
	if err := setLeaseState(p.cfg.LeaseDir, p.cfg.Instance, s.Index, leaseUsed); err != nil {
		return nil, errors.Join(fmt.Errorf("network: acquire: %w", err), p.destroy(s.Index, true))
	}
	p.mu.Lock()
	p.inUse[s.Index] = s
	p.mu.Unlock()
	p.log.DebugContext(ctx, "network slot acquired", "index", s.Index, "guest", s.GuestIP)
	c := *s
	return &c, nil
}

// Adopt re-attaches to a slot left in use by an earlier process of this instance (its sandbox
// still running in it). It fails with an error wrapping errdefs.ErrNotFound if there is no such
// slot or it is no longer intact (in which case what is left of it is removed), and with one
// wrapping errdefs.ErrFailedPrecondition if this pool already handed it out.
func (p *Pool) Adopt(ctx context.Context, index int) (*Slot, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("network: pool closed: %w", errdefs.ErrUnavailable)
	}
	if _, ok := p.inUse[index]; ok {
		p.mu.Unlock()
		return nil, fmt.Errorf("network: adopt slot %d: already in use: %w", index, errdefs.ErrFailedPrecondition)
	}
	s, ok := p.leftover[index]
	if ok {
		delete(p.leftover, index) // claimed by this call
	}
	p.ops.Add(1) // Close waits, so it sees this slot in use or not at all
	defer p.ops.Done()
	p.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("network: adopt slot %d: no in-use slot of this instance: %w", index, errdefs.ErrNotFound)
	}
	if err := p.intact(s); err != nil {
		p.log.WarnContext(ctx, "network slot to adopt is broken; removing it", "index", index, "err", err)
		if derr := p.destroy(index, true); derr != nil {
			p.log.WarnContext(ctx, "remove broken network slot", "index", index, "err", derr)
		}
		p.kick()
		return nil, fmt.Errorf("network: adopt slot %d: %w: %w", index, err, errdefs.ErrNotFound)
	}
	p.mu.Lock()
	p.inUse[index] = s
	p.mu.Unlock()
	p.log.InfoContext(ctx, "network slot adopted", "index", index, "guest", s.GuestIP)
	c := *s
	return &c, nil
}

// Release destroys a slot handed out by Acquire or Adopt: its veth pair, its netns and its lease.
// It fails with an error wrapping errdefs.ErrNotFound if s is not in use in this pool.
func (p *Pool) Release(ctx context.Context, s *Slot) error {
	if s == nil {
		return fmt.Errorf("network: release nil slot: %w", errdefs.ErrInvalidArgument)
	}
	p.mu.Lock()
	cur, ok := p.inUse[s.Index]
	if !ok || cur.NetNS != s.NetNS {
		p.mu.Unlock()
		return fmt.Errorf("network: release slot %d: not in use here: %w", s.Index, errdefs.ErrNotFound)
	}
	delete(p.inUse, s.Index)
	p.mu.Unlock()
	// A slot whose removal failed keeps its lease and its names; the next NewPool of this
	// instance removes it.
	if err := p.destroy(s.Index, true); err != nil {
		return fmt.Errorf("network: release slot %d: %w", s.Index, err)
	}
	p.log.DebugContext(ctx, "network slot released", "index", s.Index)
	p.kick() // an address came free; a filler stopped by exhaustion can go on

	// The last slot released after Close takes the rules Close had to leave with it.
	p.mu.Lock()
	last := p.closed && len(p.inUse)+len(p.leftover) == 0
	p.mu.Unlock()
	if last {
		if err := removeRules(p.cfg.Instance); err != nil {
			return fmt.Errorf("network: release slot %d: %w", s.Index, err)
		}
	}
	return nil
}

// Close stops filling the pool and destroys the prepared slots. Slots still in use (handed out,
// or left by an earlier process and not adopted) stay, with the nftables table that isolates
// them; when none is in use, nothing of this instance remains on the host. Calls after the first
// return nil.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.stop()
	<-p.done
	p.ops.Wait()

	p.mu.Lock()
	free := p.free
	p.free = nil
	inUse := len(p.inUse) + len(p.leftover)
	p.mu.Unlock()

	var errs []error
	for _, s := range free {
		errs = append(errs, p.destroy(s.Index, true))
	}
	if inUse == 0 {
		errs = append(errs, removeRules(p.cfg.Instance))
	} else {
		p.log.InfoContext(ctx, "network pool closed with slots in use; they and their rules stay", "in_use", inUse)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network: close: %w", err)
	}
	return nil
}

// InUse returns the sorted indexes of this instance's slots that are in use: handed out by this
// pool, or left in use by an earlier process and not adopted yet. After a restart, a caller
// that has adopted every slot it knows may Adopt and Release the rest.
func (p *Pool) InUse() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, 0, len(p.inUse)+len(p.leftover))
	for i := range p.inUse {
		out = append(out, i)
	}
	for i := range p.leftover {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// kick asks the filler to top up the pool; it never blocks.
func (p *Pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fill keeps cfg.PoolSize slots prepared until ctx ends. It builds one slot at a time; after a
// failure it retries with backoff, and after exhaustion it waits for a Release.
func (p *Pool) fill(ctx context.Context) {
	defer close(p.done)
	const maxBackoff = 30 * time.Second
	backoff := 250 * time.Millisecond
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-retry:
		}
		retry = nil
		err := p.topUp(ctx)
		switch {
		case err == nil:
			backoff = 250 * time.Millisecond
		case ctx.Err() != nil:
			return
		case errors.Is(err, errdefs.ErrResourceExhausted):
			p.log.DebugContext(ctx, "network pool: no free address; waiting for a release")
		default:
			p.log.WarnContext(ctx, "network pool: prepare slot", "err", err, "retry_in", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, maxBackoff)
		}
	}
}

// topUp builds slots until the pool holds cfg.PoolSize of them.
func (p *Pool) topUp(ctx context.Context) error {
	for {
		p.mu.Lock()
		need := !p.closed && len(p.free) < p.cfg.PoolSize
		p.mu.Unlock()
		if !need || ctx.Err() != nil {
			return ctx.Err()
		}
		s, err := p.build(ctx)
		if err != nil {
			return err
		}
		p.mu.Lock()
		closed := p.closed
		if !closed {
			p.free = append(p.free, s)
		}
		p.mu.Unlock()
		if closed {
			return p.destroy(s.Index, true)
		}
	}
}

// slotAt describes the slot with lease index i of this instance (no side effects).
func (p *Pool) slotAt(i int) *Slot {
	host, guest := slotAddrs(p.cfg.CIDR, i)
	name := netnsName(p.cfg.Instance, i)
	return &Slot{
		Index:     i,
		NetNS:     name,
		NetNSPath: netnsDir + "/" + name,
		HostIf:    hostIfName(p.cfg.Instance, i),
		GuestIf:   guestIfName,
		HostIP:    host,
		GuestIP:   guest,
	}
}
