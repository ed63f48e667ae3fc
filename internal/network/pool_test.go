package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/testutil"
	"github.com/vishvananda/netlink"
)

func TestSharedLeaseDir(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	cfg1 := testConfig(t)
	p1 := newTestPool(t, cfg1)
	cfg2 := cfg1
	cfg2.CIDR = p1.cfg.CIDR // newTestPool may have picked another one
	for cfg2.Instance == cfg1.Instance {
		cfg2.Instance = testConfig(t).Instance
	}
	p2 := newTestPool(t, cfg2)
	if p2.cfg.CIDR != p1.cfg.CIDR {
		t.Fatalf("second pool refused the shared CIDR %s", p1.cfg.CIDR)
	}
	ctx := context.Background()
	seen := map[netip.Addr]string{}
	var slots [2][]*Slot
	for k := range 4 {
		for j, p := range []*Pool{p1, p2} {
			s, err := p.Acquire(ctx)
			if err != nil {
				t.Fatalf("pool %d acquire %d: %v", j, k, err)
			}
			slots[j] = append(slots[j], s)
			for _, a := range []netip.Addr{s.HostIP, s.GuestIP.Addr()} {
				if prev, dup := seen[a]; dup {
					t.Errorf("address %s given to %s and %s", a, prev, s.NetNS)
				}
				seen[a] = s.NetNS
			}
		}
	}
	for j, p := range []*Pool{p1, p2} {
		for _, s := range slots[j] {
			if err := p.Release(ctx, s); err != nil {
				t.Error(err)
			}
		}
		if err := p.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	assertNoResidue(t, cfg1.Instance, cfg1.LeaseDir)
	assertNoResidue(t, cfg2.Instance, cfg2.LeaseDir)
}

func TestReleaseAndClose(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	cfg := testConfig(t)
	cfg.PoolSize = 3
	p := newTestPool(t, cfg)
	ctx := context.Background()
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.InUse(); !slices.Equal(got, []int{s.Index}) {
		t.Errorf("InUse() = %v, want [%d]", got, s.Index)
	}
	if l, err := readLease(cfg.LeaseDir, s.Index); err != nil || l.state != leaseUsed {
		t.Errorf("lease of acquired slot = %+v, %v; want used", l, err)
	}
	if err := p.Release(ctx, s); err != nil {
		t.Fatal(err)
	}
	if len(p.InUse()) != 0 {
		t.Errorf("InUse() after Release = %v", p.InUse())
	}
	if isNetNSMount(s.NetNSPath) {
		t.Errorf("netns %s survived Release", s.NetNS)
	}
	if _, err := os.Stat(s.NetNSPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file %s after Release: %v", s.NetNSPath, err)
	}
	if _, err := netlink.LinkByName(s.HostIf); err == nil {
		t.Errorf("veth %s survived Release", s.HostIf)
	}
	if _, err := readLease(cfg.LeaseDir, s.Index); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lease %d after Release: %v", s.Index, err)
	}
	if err := p.Release(ctx, s); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Release: %v, want ErrNotFound", err)
	}

	waitPrepared(t, p, cfg.PoolSize)
	s2, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !hasTable(t, cfg.Instance) {
		t.Error("Close removed the rules of a slot still in use")
	}
	if _, err := p.Acquire(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Acquire after Close: %v, want ErrUnavailable", err)
	}
	// The last in-use slot released after Close takes the rest of the instance with it.
	if err := p.Release(ctx, s2); err != nil {
		t.Fatal(err)
	}
	assertNoResidue(t, cfg.Instance, cfg.LeaseDir)
}

func TestExhaustion(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	cfg := testConfig(t)
	cfg.CIDR = netip.PrefixFrom(cfg.CIDR.Addr(), 29) // two slots
	cfg.PoolSize = -1
	p := newTestPool(t, cfg)
	ctx := context.Background()
	var got []*Slot
	for range 2 {
		s, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if _, err := p.Acquire(ctx); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third Acquire on a /29: %v, want ErrResourceExhausted", err)
	}
	if err := p.Release(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	for _, s := range []*Slot{s, got[1]} {
		if err := p.Release(ctx, s); err != nil {
			t.Error(err)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoResidue(t, cfg.Instance, cfg.LeaseDir)
}

// A clean restart: Close keeps the slot a sandbox runs in (and its isolation); the next pool of
// the instance adopts it.
func TestCloseKeepsInUseSlots(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	cfg := testConfig(t)
	p1 := newTestPool(t, cfg)
	cfg.CIDR = p1.cfg.CIDR
	ctx := context.Background()
	s, err := p1.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agent, _ := serveEcho(t, s) // the "sandbox", which outlives spaced
	waitPrepared(t, p1, cfg.PoolSize)
	pooled := p1.freeIndexes()
	if err := p1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"lease " + fmt.Sprint(s.Index), "link " + s.HostIf, "netns " + s.NetNS, "nft table " + tableName(cfg.Instance)}
	got := residue(t, cfg.Instance, cfg.LeaseDir)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("after Close with a slot in use: %v, want %v", got, want)
	}
	_, port := hostListener(t)
	if err := dialFrom(s.NetNSPath, netip.AddrPortFrom(s.HostIP, port), blocked); err == nil {
		t.Error("in-use slot reached the host after Close")
	}
	for _, i := range pooled {
		if isNetNSMount(p1.slotAt(i).NetNSPath) {
			t.Errorf("prepared slot %d survived Close", i)
		}
	}

	cfg.PoolSize = -1
	p2 := newTestPool(t, cfg)
	if got := p2.InUse(); !slices.Equal(got, []int{s.Index}) {
		t.Fatalf("InUse() after restart = %v, want [%d]", got, s.Index)
	}
	if _, err := p2.Adopt(ctx, s.Index+1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Adopt of an unknown index: %v, want ErrNotFound", err)
	}
	got2, err := p2.Adopt(ctx, s.Index)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if *got2 != *s {
		t.Errorf("Adopt = %+v, want %+v", got2, s)
	}
	if _, err := p2.Adopt(ctx, s.Index); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("second Adopt: %v, want ErrFailedPrecondition", err)
	}
	if err := echoOnce(agent, open); err != nil {
		t.Errorf("host -> adopted slot's agent: %v", err)
	}
	if err := p2.Release(ctx, got2); err != nil {
		t.Fatal(err)
	}
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoResidue(t, cfg.Instance, cfg.LeaseDir)
}

// A crash: the process vanishes with prepared slots, an in-use slot, half-made state.
func TestCrashRecovery(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	cfg := testConfig(t)
	cfg.PoolSize = 3
	p1 := newTestPool(t, cfg)
	cfg.CIDR = p1.cfg.CIDR
	ctx := context.Background()
	used, err := p1.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agent, _ := serveEcho(t, used)
	gone, err := p1.Acquire(ctx) // in use, but its sandbox's netns will vanish
	if err != nil {
		t.Fatal(err)
	}
	waitPrepared(t, p1, cfg.PoolSize)
	pooled := p1.freeIndexes()
	p1.abandon()

	// Half-made leftovers: a temporary lease file, a netns with no lease, and the vanished netns.
	tmp, err := writeTemp(cfg.LeaseDir, cfg.Instance, nil)
	if err != nil {
		t.Fatal(err)
	}
	orphan := p1.slotAt(p1.count - 1)
	if err := createNetNS(orphan.NetNSPath); err != nil {
		t.Fatal(err)
	}
	if err := removeNetNS(gone.NetNSPath); err != nil {
		t.Fatal(err)
	}

	cfg.PoolSize = -1
	p2 := newTestPool(t, cfg)
	if got := p2.InUse(); !slices.Equal(got, []int{used.Index}) {
		t.Errorf("InUse() after crash = %v, want [%d]", got, used.Index)
	}
	want := []string{"lease " + fmt.Sprint(used.Index), "link " + used.HostIf, "netns " + used.NetNS, "nft table " + tableName(cfg.Instance)}
	got := residue(t, cfg.Instance, cfg.LeaseDir)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("after reclaim: %v, want %v (pooled were %v, vanished %d, orphan %d, temp %s)",
			got, want, pooled, gone.Index, orphan.Index, tmp)
	}
	if _, err := p2.Adopt(ctx, gone.Index); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Adopt of the vanished slot: %v, want ErrNotFound", err)
	}
	s, err := p2.Adopt(ctx, used.Index)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if err := echoOnce(agent, open); err != nil {
		t.Errorf("host -> adopted slot's agent: %v", err)
	}
	_, port := hostListener(t)
	if err := dialFrom(s.NetNSPath, netip.AddrPortFrom(s.HostIP, port), blocked); err == nil {
		t.Error("adopted slot reached the host")
	}
	if err := p2.Release(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoResidue(t, cfg.Instance, cfg.LeaseDir)
}

// A slot left in use whose netns disappears after the restart is reported gone and cleaned up.
func TestAdoptBrokenSlot(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	cfg := testConfig(t)
	cfg.PoolSize = -1
	p1 := newTestPool(t, cfg)
	cfg.CIDR = p1.cfg.CIDR
	ctx := context.Background()
	s, err := p1.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p1.abandon()
	p2 := newTestPool(t, cfg)
	if err := deleteLink(s.HostIf); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Adopt(ctx, s.Index); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Adopt of a slot without its veth: %v, want ErrNotFound", err)
	}
	if len(p2.InUse()) != 0 {
		t.Errorf("InUse() = %v, want none", p2.InUse())
	}
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoResidue(t, cfg.Instance, cfg.LeaseDir)
}

func TestCIDRConflict(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	cfg := testConfig(t)
	// A link of the host, not a slot, with an address inside the CIDR. It stays down: nothing
	// is routed through it.
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sptest" + cfg.Instance}, PeerName: "sptestp" + cfg.Instance}
	if err := netlink.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(dummy)
	addr := netip.PrefixFrom(cfg.CIDR.Addr().Next().Next().Next().Next().Next(), 24)
	if err := netlink.AddrAdd(dummy, &netlink.Addr{IPNet: prefixNet(addr)}); err != nil {
		t.Fatal(err)
	}
	for _, cidr := range []netip.Prefix{cfg.CIDR, netip.PrefixFrom(cfg.CIDR.Addr(), 28)} {
		c := cfg
		c.CIDR = cidr
		p, err := NewPool(context.Background(), c)
		if err == nil {
			p.Close(context.Background())
			t.Errorf("NewPool accepted %s, which overlaps %s on %s", cidr, addr, dummy.Name)
		} else if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), dummy.Name) {
			t.Errorf("NewPool(%s) error = %v, want ErrFailedPrecondition naming %s", cidr, err, dummy.Name)
		}
	}
	assertNoResidue(t, cfg.Instance, cfg.LeaseDir)
}

func BenchmarkAcquireWarm(b *testing.B) {
	testutil.RequiresRoot(b)
	cfg := testConfig(b)
	cfg.Logger = nil
	if dir := os.Getenv("SPACE_BENCH_LEASEDIR"); dir != "" {
		d, err := os.MkdirTemp(dir, "leases")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		cfg.LeaseDir = d
	}
	p := newTestPool(b, cfg)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		waitPrepared(b, p, cfg.PoolSize)
		b.StartTimer()
		s, err := p.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.Release(ctx, s); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkBuildCold(b *testing.B) {
	testutil.RequiresRoot(b)
	cfg := testConfig(b)
	cfg.Logger = nil
	cfg.PoolSize = -1
	p := newTestPool(b, cfg)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		s, err := p.build(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.destroy(s.Index, true); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
