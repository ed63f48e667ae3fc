package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/space-sandbox/space/internal/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

const (
	// blocked is how long a probe that must fail waits for an answer.
	blocked = 300 * time.Millisecond
	// open is how long a probe that must succeed may take.
	open = 2 * time.Second
)

// serveEcho starts a TCP echo server inside s's netns on the guest address and returns its
// address; it stops when the test ends (or when stopped, to end a "sandbox").
func serveEcho(t *testing.T, s *Slot) (netip.AddrPort, func()) {
	t.Helper()
	var ln net.Listener
	err := inNetNS(s.NetNSPath, func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(s.GuestIP.Addr(), 0).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", s.NetNS, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	stop := func() { ln.Close() }
	t.Cleanup(stop)
	return netip.MustParseAddrPort(ln.Addr().String()), stop
}

// hostListener listens on 0.0.0.0 of the host on a free port; sandboxes must never reach it.
func hostListener(t *testing.T) (*net.TCPListener, uint16) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, uint16(ln.Addr().(*net.TCPAddr).Port)
}

// echoOnce dials addr from the calling thread's netns and checks that a line comes back.
func echoOnce(addr netip.AddrPort, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp4", addr.String(), timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "hello\n" {
		return fmt.Errorf("echo returned %q", line)
	}
	return nil
}

// dialFrom dials addr from inside the netns at path.
func dialFrom(path string, addr netip.AddrPort, timeout time.Duration) error {
	return inNetNS(path, func() error {
		c, err := net.DialTimeout("tcp4", addr.String(), timeout)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// udpFrom sends one datagram to addr from inside the netns at path, from local address laddr
// (zero: any).
func udpFrom(path string, laddr, addr netip.AddrPort) error {
	return inNetNS(path, func() error {
		var la *net.UDPAddr
		if laddr.IsValid() {
			la = net.UDPAddrFromAddrPort(laddr)
		}
		c, err := net.ListenUDP("udp4", la)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.WriteToUDPAddrPort([]byte("ping"), addr)
		return err
	})
}

// received reports whether c receives a datagram within d.
func received(c *net.UDPConn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	_, _, err := c.ReadFromUDPAddrPort(buf)
	return err == nil
}

// accepted reports whether ln has a pending connection within d.
func accepted(ln *net.TCPListener, d time.Duration) bool {
	ln.SetDeadline(time.Now().Add(d))
	c, err := ln.Accept()
	if err == nil {
		c.Close()
		return true
	}
	return false
}

func readSysctl(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return strings.TrimSpace(string(b))
}

func TestIsolation(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	ctx := context.Background()
	a, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a.Index == b.Index || a.GuestIP == b.GuestIP {
		t.Fatalf("two slots share index or address: %+v %+v", a, b)
	}
	agentA, _ := serveEcho(t, a)
	agentB, _ := serveEcho(t, b)

	// Host listeners on all addresses: what a sandbox must not reach.
	tcpLn, tcpPort := hostListener(t)
	udpLn, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		t.Fatal(err)
	}
	defer udpLn.Close()
	udpPort := uint16(udpLn.LocalAddr().(*net.UDPAddr).Port)

	t.Run("host reaches agents", func(t *testing.T) {
		for _, addr := range []netip.AddrPort{agentA, agentB} {
			if err := echoOnce(addr, open); err != nil {
				t.Errorf("host -> %s: %v", addr, err)
			}
		}
		if ok, err := ping(a.GuestIP.Addr(), open); err != nil || !ok {
			t.Errorf("host ping %s: reply %v, err %v", a.GuestIP.Addr(), ok, err)
		}
	})

	t.Run("slot cannot reach host", func(t *testing.T) {
		if err := dialFrom(a.NetNSPath, netip.AddrPortFrom(a.HostIP, tcpPort), blocked); err == nil {
			t.Errorf("slot A reached the host's 0.0.0.0:%d listener via %s", tcpPort, a.HostIP)
		}
		if err := dialFrom(a.NetNSPath, netip.AddrPortFrom(b.HostIP, tcpPort), blocked); err == nil {
			t.Errorf("slot A reached the host's listener via slot B's host address %s", b.HostIP)
		}
		if accepted(tcpLn, 50*time.Millisecond) {
			t.Error("host listener accepted a connection from a slot")
		}
		if err := udpFrom(a.NetNSPath, netip.AddrPort{}, netip.AddrPortFrom(a.HostIP, udpPort)); err != nil {
			t.Fatal(err)
		}
		if received(udpLn, blocked) {
			t.Error("host UDP listener received a datagram from slot A")
		}
		err := inNetNS(a.NetNSPath, func() error {
			ok, err := ping(a.HostIP, blocked)
			if ok {
				return errors.New("host answered a ping from slot A")
			}
			return err
		})
		if err != nil {
			t.Error(err)
		}
	})

	t.Run("slot cannot reach other slot", func(t *testing.T) {
		if err := dialFrom(a.NetNSPath, agentB, blocked); err == nil {
			t.Errorf("slot A reached slot B's %s", agentB)
		}
		// A hostile sandbox routes B's subnet through the host: still nothing.
		nh := nsHandle(t, a)
		route := &netlink.Route{
			LinkIndex: linkIndex(t, nh, a.GuestIf),
			Dst:       prefixNet(b.GuestIP.Masked()),
			Gw:        a.HostIP.AsSlice(),
		}
		if err := nh.RouteAdd(route); err != nil {
			t.Fatalf("add route in slot A: %v", err)
		}
		if err := dialFrom(a.NetNSPath, agentB, blocked); err == nil {
			t.Errorf("slot A reached slot B's %s through the host", agentB)
		}
	})

	t.Run("netns layout", func(t *testing.T) {
		nh := nsHandle(t, a)
		routes, err := nh.RouteList(nil, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		defaults := 0
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				defaults++
				if !r.Gw.Equal(a.HostIP.AsSlice()) {
					t.Errorf("default route in slot netns not via the host link: %+v", r)
				}
			}
		}
		if defaults != 1 {
			t.Errorf("%d default routes in slot netns, want 1 (via the host, where nftables decides)", defaults)
		}
		if lo, err := nh.LinkByName("lo"); err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("lo in slot netns is not up (%v)", err)
		}
		addrs, err := nh.AddrList(nil, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) > 0 {
			t.Errorf("IPv6 addresses in slot netns: %v", addrs)
		}
		host, err := netlink.LinkByName(a.HostIf)
		if err != nil {
			t.Fatal(err)
		}
		if addrs, _ := netlink.AddrList(host, netlink.FAMILY_V6); len(addrs) > 0 {
			t.Errorf("IPv6 addresses on %s: %v", a.HostIf, addrs)
		}
		if got := readSysctl(t, "/proc/sys/net/ipv6/conf/"+a.HostIf+"/disable_ipv6"); got != "1" {
			t.Errorf("%s disable_ipv6 = %s, want 1", a.HostIf, got)
		}
		var guestV6 string
		if err := inNetNS(a.NetNSPath, func() error {
			b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + a.GuestIf + "/disable_ipv6")
			guestV6 = strings.TrimSpace(string(b))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if guestV6 != "1" {
			t.Errorf("%s disable_ipv6 in netns = %s, want 1", a.GuestIf, guestV6)
		}
	})

	// Slot B claims slot A's address to inject into the host's exchange with A.
	t.Run("slot cannot spoof another slot", func(t *testing.T) {
		hostSock, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a.HostIP, 0)))
		if err != nil {
			t.Fatal(err)
		}
		defer hostSock.Close()
		hostAddr := netip.MustParseAddrPort(hostSock.LocalAddr().String())
		var guestSock *net.UDPConn
		guestAddr := netip.AddrPortFrom(a.GuestIP.Addr(), 9999)
		if err := inNetNS(a.NetNSPath, func() error {
			guestSock, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(guestAddr))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer guestSock.Close()
		// The host opens an exchange with A; A's genuine reply gets through.
		if _, err := hostSock.WriteToUDPAddrPort([]byte("hi"), guestAddr); err != nil {
			t.Fatal(err)
		}
		if !received(guestSock, open) {
			t.Fatal("slot A did not receive the host's datagram")
		}
		if _, err := guestSock.WriteToUDPAddrPort([]byte("reply"), hostAddr); err != nil {
			t.Fatal(err)
		}
		if !received(hostSock, open) {
			t.Fatal("host did not receive slot A's reply")
		}
		// B takes A's address and sends a "reply" of the same flow.
		nh := nsHandle(t, b)
		idx := linkIndex(t, nh, b.GuestIf)
		link, _ := nh.LinkByIndex(idx)
		if err := nh.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a.GuestIP.Addr(), 32))}); err != nil {
			t.Fatal(err)
		}
		if err := nh.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: prefixNet(netip.PrefixFrom(a.HostIP, 32)), Scope: netlink.SCOPE_LINK}); err != nil {
			t.Fatal(err)
		}
		if err := udpFrom(b.NetNSPath, guestAddr, hostAddr); err != nil {
			t.Fatal(err)
		}
		if received(hostSock, blocked) {
			t.Error("host accepted a datagram from slot B spoofing slot A's address")
		}

		// Control: without the table, the same packets would get through (so the checks
		// above fail for the right reason). A host with strict rp_filter drops spoofed packets
		// itself; then the spoofing control says nothing.
		t.Run("control without rules", func(t *testing.T) {
			if err := removeRules(cfg.Instance); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := installRules(cfg.Instance, nil); err != nil {
					t.Fatal(err)
				}
			}()
			if err := dialFrom(a.NetNSPath, netip.AddrPortFrom(a.HostIP, tcpPort), open); err != nil {
				t.Errorf("without rules slot A still cannot reach the host listener: %v", err)
			}
			accepted(tcpLn, 50*time.Millisecond)
			if err := udpFrom(a.NetNSPath, netip.AddrPort{}, netip.AddrPortFrom(a.HostIP, udpPort)); err != nil {
				t.Fatal(err)
			}
			if !received(udpLn, open) {
				t.Error("without rules the host UDP listener still receives nothing from slot A")
			}
			if err := inNetNS(a.NetNSPath, func() error {
				if ok, err := ping(a.HostIP, open); !ok {
					return fmt.Errorf("without rules the host still does not answer slot A's ping (%v)", err)
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
			if readSysctl(t, "/proc/sys/net/ipv4/conf/all/rp_filter") == "1" ||
				readSysctl(t, "/proc/sys/net/ipv4/conf/"+b.HostIf+"/rp_filter") == "1" {
				t.Log("host uses strict rp_filter; skipping the spoofing control")
				return
			}
			if err := udpFrom(b.NetNSPath, guestAddr, hostAddr); err != nil {
				t.Fatal(err)
			}
			if !received(hostSock, open) {
				t.Error("without rules the spoofed datagram still does not arrive")
			}
		})
	})

	for _, s := range []*Slot{a, b} {
		if err := p.Release(ctx, s); err != nil {
			t.Errorf("Release(%d): %v", s.Index, err)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoResidue(t, cfg.Instance, cfg.LeaseDir)
}

func nsHandle(t *testing.T, s *Slot) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(s.NetNSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func linkIndex(t *testing.T, h *netlink.Handle, name string) int {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// The forward hook cannot be exercised here without turning on IP forwarding for the whole
// host, so its rules are checked by shape; installing twice (a restart) must replace, not add.
func TestRulesShape(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	inst := testConfig(t).Instance
	t.Cleanup(func() { removeRules(inst) })
	for range 2 {
		if err := installRules(inst, nil); err != nil {
			t.Fatal(err)
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	type ruleShape struct {
		Match   string // meta key and interface prefix the rule starts with, if any
		Verdict string
	}
	got := map[string][]ruleShape{}
	for _, ch := range chains {
		if ch.Table.Name != tableName(inst) {
			continue
		}
		name := ch.Name
		if ch.Hooknum != nil {
			name = fmt.Sprintf("%s hook=%d prio=%d", ch.Name, *ch.Hooknum, *ch.Priority)
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		got[name] = []ruleShape{}
		for _, r := range rules {
			var sh ruleShape
			if m, ok := r.Exprs[0].(*expr.Meta); ok {
				sh.Match = fmt.Sprintf("meta %d %s", m.Key, r.Exprs[1].(*expr.Cmp).Data)
			}
			v := r.Exprs[len(r.Exprs)-1].(*expr.Verdict)
			sh.Verdict = fmt.Sprintf("%d %s", v.Kind, v.Chain)
			got[name] = append(got[name], sh)
		}
	}
	prefix := hostIfPrefix(inst)
	drop := fmt.Sprintf("%d ", expr.VerdictDrop)
	want := map[string][]ruleShape{
		fmt.Sprintf("input hook=%d prio=%d", *nftables.ChainHookInput, rulePriority): {
			{fmt.Sprintf("meta %d %s", expr.MetaKeyIIFNAME, prefix), fmt.Sprintf("%d %s", expr.VerdictJump, chainSandboxIn)},
		},
		fmt.Sprintf("forward hook=%d prio=%d", *nftables.ChainHookForward, rulePriority): {
			{fmt.Sprintf("meta %d %s", expr.MetaKeyIIFNAME, prefix), drop},
			{fmt.Sprintf("meta %d %s", expr.MetaKeyOIFNAME, prefix), drop},
		},
		chainSandboxIn: {{"", drop}, {"", fmt.Sprintf("%d ", expr.VerdictAccept)}, {"", drop}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ruleset (-want +got):\n%s", diff)
	}
}
