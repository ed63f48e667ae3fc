package network

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// build leases an address and makes a complete slot for it, or nothing.
func (p *Pool) build(ctx context.Context) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	start := p.next
	p.mu.Unlock()
	i, err := takeLease(p.cfg.LeaseDir, p.cfg.Instance, start, p.count)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.next = (i + 1) % p.count // round robin: a released address is reused as late as possible
	p.mu.Unlock()
	s := p.slotAt(i)
	if err := p.setup(ctx, s); err != nil {
		return nil, errors.Join(fmt.Errorf("slot %d: %w", i, err), p.destroy(i, true))
	}
	return s, nil
}

// setup creates the netns and veth pair of s and configures both ends.
func (p *Pool) setup(ctx context.Context, s *Slot) error {
	if err := createNetNS(s.NetNSPath); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ns, err := netns.GetFromPath(s.NetNSPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", s.NetNS, err)
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in netns %s: %w", s.NetNS, err)
	}
	defer nh.Close()

	attrs := netlink.NewLinkAttrs()
	attrs.Name = s.HostIf
	// The peer is created directly inside the netns under its final name.
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: s.GuestIf, PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", s.HostIf, err)
	}
	host, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		return fmt.Errorf("find veth %s: %w", s.HostIf, err)
	}
	// Before the link goes up, so it never gets an IPv6 link-local address.
	if err := disableIPv6(s.HostIf); err != nil {
		return err
	}
	hostAddr := &netlink.Addr{IPNet: &net.IPNet{IP: s.HostIP.AsSlice(), Mask: net.CIDRMask(30, 32)}}
	if err := netlink.AddrAdd(host, hostAddr); err != nil {
		return fmt.Errorf("address %s on %s: %w", s.HostIP, s.HostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("up %s: %w", s.HostIf, err)
	}

	lo, err := nh.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", s.NetNS, err)
	}
	if err := nh.LinkSetUp(lo); err != nil {
		return fmt.Errorf("up lo in %s: %w", s.NetNS, err)
	}
	guest, err := nh.LinkByName(s.GuestIf)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", s.GuestIf, s.NetNS, err)
	}
	guestAddr := &netlink.Addr{IPNet: &net.IPNet{IP: s.GuestIP.Addr().AsSlice(), Mask: net.CIDRMask(s.GuestIP.Bits(), 32)}}
	if err := nh.AddrAdd(guest, guestAddr); err != nil {
		return fmt.Errorf("address %s on %s in %s: %w", s.GuestIP, s.GuestIf, s.NetNS, err)
	}
	if err := nh.LinkSetUp(guest); err != nil {
		return fmt.Errorf("up %s in %s: %w", s.GuestIf, s.NetNS, err)
	}
	// Everything goes to the host, where nftables sends TCP and DNS to the egress gateway and
	// drops the rest (nft.go).
	def := &netlink.Route{LinkIndex: guest.Attrs().Index, Gw: s.HostIP.AsSlice(), Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
	if err := nh.RouteAdd(def); err != nil {
		return fmt.Errorf("default route in %s: %w", s.NetNS, err)
	}
	return nil
}

// forgetConntrack deletes the conntrack entries of the slot's guest address, so that no stale
// "established" entry matches the packets of the next sandbox given the address. Best effort:
// without conntrack there is nothing to forget. It walks the whole conntrack table (tens of ms),
// so only slots that were in use pay for it.
func (p *Pool) forgetConntrack(s *Slot) {
	f := &netlink.ConntrackFilter{}
	if err := f.AddIP(netlink.ConntrackReplyAnyIP, s.GuestIP.Addr().AsSlice()); err != nil {
		return
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
		p.log.Debug("forget conntrack entries", "guest", s.GuestIP, "err", err)
	}
}

// destroy removes everything of slot i of this instance: veth pair, netns, conntrack entries if
// it was in use, and (if ownLease and the rest is gone) its lease. Missing parts are not errors.
func (p *Pool) destroy(i int, ownLease bool) error {
	s := p.slotAt(i)
	l, lerr := readLease(p.cfg.LeaseDir, i)
	wasUsed := lerr == nil && l.owner == p.cfg.Instance && l.state == leaseUsed
	var errs []error
	if err := deleteLink(s.HostIf); err != nil {
		errs = append(errs, err)
	}
	if err := removeNetNS(s.NetNSPath); err != nil {
		errs = append(errs, err)
	}
	if wasUsed && len(errs) == 0 {
		p.forgetConntrack(s)
	}
	if len(errs) == 0 && ownLease {
		if err := dropLease(p.cfg.LeaseDir, p.cfg.Instance, i); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy slot %d: %w", i, err)
	}
	return nil
}

// intact reports why s cannot be used as is, or nil.
func (p *Pool) intact(s *Slot) error {
	l, err := readLease(p.cfg.LeaseDir, s.Index)
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	if l.owner != p.cfg.Instance || l.state != leaseUsed {
		return fmt.Errorf("lease held by %s (%s)", l.owner, l.state)
	}
	if !isNetNSMount(s.NetNSPath) {
		return fmt.Errorf("netns %s is gone", s.NetNS)
	}
	link, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		return fmt.Errorf("veth %s: %w", s.HostIf, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("addresses of %s: %w", s.HostIf, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == s.HostIP {
			return nil
		}
	}
	return fmt.Errorf("veth %s does not have address %s", s.HostIf, s.HostIP)
}

// deleteLink deletes the named link (and so its veth peer) if it exists.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if _, ok := errors.AsType[netlink.LinkNotFoundError](err); ok {
			return nil
		}
		return fmt.Errorf("find link %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// ensureDirs creates the lease directory and makes the netns directory a shared mount point,
// as `ip netns add` does, so that netns mounts made in it propagate to mount namespaces created
// later (runsc's among them) and unmounting here releases them everywhere.
func ensureDirs(leaseDir string) error {
	if err := os.MkdirAll(leaseDir, 0o755); err != nil {
		return fmt.Errorf("lease dir: %w", err)
	}
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("netns dir: %w", err)
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err = unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount: %w", netnsDir, err)
	}
	return nil
}

// createNetNS creates a network namespace and pins it at path with a bind mount. IPv6 is disabled
// in it before any interface exists there, so every interface (the veth peer included) is born
// without IPv6.
func createNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// This thread enters the new netns and never leaves it: the goroutine exits still
		// locked, so the runtime discards the thread instead of reusing it for other work.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare netns: %w", err)
			}
			src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("pin netns at %s: %w", path, err)
			}
			// /proc/sys/net resolves against the opening thread's netns: this one.
			for _, conf := range []string{"all", "default"} {
				if err := disableIPv6(conf); err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		return errors.Join(err, removeNetNS(path))
	}
	return nil
}

// removeNetNS unmounts and removes a netns pinned at path; a missing one is not an error.
func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// isNetNSMount reports whether path is a pinned network namespace.
func isNetNSMount(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// disableIPv6 sets net.ipv6.conf.<conf>.disable_ipv6=1 in the calling thread's netns. A host
// without IPv6 has nothing to disable.
func disableIPv6(conf string) error {
	path := "/proc/sys/net/ipv6/conf/" + conf + "/disable_ipv6"
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("disable ipv6 on %s: %w", conf, err)
	}
	_, err = f.WriteString("1")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("disable ipv6 on %s: %w", conf, err)
	}
	return nil
}
