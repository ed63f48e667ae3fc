package network

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// reclaim removes what an earlier process of this instance left: leases, netns and veths of
// slots that were not in use, and in-use slots whose netns is gone. Intact in-use slots are kept
// in p.leftover for Adopt.
func (p *Pool) reclaim(ctx context.Context) error {
	inst := p.cfg.Instance
	entries, err := os.ReadDir(p.cfg.LeaseDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, tmpPrefix(inst)) {
			if err := os.Remove(filepath.Join(p.cfg.LeaseDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		i, ok := parseIndex(name)
		if !ok {
			continue
		}
		l, err := readLease(p.cfg.LeaseDir, i)
		if err != nil || l.owner != inst {
			continue
		}
		s := p.slotAt(i)
		// An index past the CIDR (it shrank since) cannot be adopted: its addresses are gone.
		if l.state == leaseUsed && isNetNSMount(s.NetNSPath) && i < p.count {
			p.leftover[i] = s
			continue
		}
		p.log.InfoContext(ctx, "reclaiming stale network slot", "index", i, "state", string(l.state))
		if err := p.destroy(i, true); err != nil {
			errs = append(errs, err)
		}
	}

	// Names of this instance with no kept lease behind them.
	nsEntries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range nsEntries {
		i, ok := parseIndexed(e.Name(), "space-"+inst+"-")
		if !ok || p.leftover[i] != nil {
			continue
		}
		p.log.InfoContext(ctx, "reclaiming stale netns", "netns", e.Name())
		if err := removeNetNS(filepath.Join(netnsDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	for _, l := range links {
		i, ok := parseIndexed(l.Attrs().Name, hostIfPrefix(inst))
		if !ok || p.leftover[i] != nil {
			continue
		}
		p.log.InfoContext(ctx, "reclaiming stale veth", "link", l.Attrs().Name)
		if err := deleteLink(l.Attrs().Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkHostConflicts fails, with an error wrapping errdefs.ErrFailedPrecondition, if a route or
// address of the host overlaps the CIDR and does not belong to a spaced slot: a host veth
// "sp<inst>h<i>" whose lease <i> in our lease directory is held by <inst>, carrying the i-th
// /30. Default routes do not count.
func (p *Pool) checkHostConflicts() error {
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list links: %w", err)
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	type use struct {
		prefix netip.Prefix
		link   int
		what   string
	}
	var uses []use
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if pfx, ok := ipNetPrefix(r.Dst); ok && pfx.Bits() > 0 {
			uses = append(uses, use{pfx, r.LinkIndex, fmt.Sprintf("route %s (table %d)", pfx, r.Table)})
		}
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if pfx, ok := ipNetPrefix(a.IPNet); ok {
			uses = append(uses, use{pfx, a.LinkIndex, "address " + pfx.String()})
		}
	}
	for _, u := range uses {
		if !u.prefix.Overlaps(p.cfg.CIDR) || p.isSlotUse(u.prefix, names[u.link]) {
			continue
		}
		return fmt.Errorf("cidr %s overlaps %s on %q, which is not a spaced slot: %w",
			p.cfg.CIDR, u.what, names[u.link], errdefs.ErrFailedPrecondition)
	}
	return nil
}

// isSlotUse reports whether prefix on the link named link belongs to a slot leased in our lease
// directory (by any instance).
func (p *Pool) isSlotUse(prefix netip.Prefix, link string) bool {
	owner, i, ok := parseHostIf(link)
	if !ok || prefix.Bits() < 30 {
		return false
	}
	if j, ok := slotIndexOf(p.cfg.CIDR, prefix.Addr()); !ok || j != i {
		return false
	}
	l, err := readLease(p.cfg.LeaseDir, i)
	return err == nil && l.owner == owner
}

func ipNetPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if a.Is4In6() && bits == 128 {
		ones -= 96
	}
	if bits == 0 || ones < 0 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a.Unmap(), ones), true
}
