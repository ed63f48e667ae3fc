package egress

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// Target is the sandbox a connection or query comes from, and its policy.
type Target struct {
	SandboxID string
	Policy    Policy
	// Passthrough names TLS hosts spliced end to end instead of intercepted (clients that pin
	// certificates); their requests' Host is not checked against the SNI: "fronting not checked".
	// Every other TLS connection is intercepted.
	Passthrough []Rule
	Credentials []Credential // headers set on requests to their hosts (intercepted)
}

// Config holds a gateway's dependencies.
type Config struct {
	// Upstream is the resolver the gateway asks ("ip:port", SPACE_EGRESS_DNS); empty means the
	// host's own resolver.
	Upstream string
	// Lookup finds the sandbox whose link address src is.
	Lookup func(src netip.Addr) (Target, bool)
	// Blocked lists further addresses never dialled: the host's own and the sandbox links.
	Blocked func() []netip.Prefix
	Audit   *Audit
	Logger  *slog.Logger
	// CA signs the certificates of intercepted hosts; without it nothing is intercepted (and
	// sandboxes with credentials or inspection get no TLS through).
	CA *CA
	// ExtraRoots are PEM certificates trusted for upstream hosts besides the system's
	// (SPACE_EGRESS_CA).
	ExtraRoots []byte
	// Limits bound each sandbox's connections and queries; zero fields take DefaultLimits.
	Limits Limits
}

// Gateway is the egress gateway of one spaced instance: a transparent TCP proxy and a DNS
// server, on ports of the host that the instance's nftables rules redirect sandbox traffic to.
type Gateway struct {
	cfg    Config
	log    *slog.Logger
	res    *net.Resolver
	roots  *x509.CertPool
	tcp    net.Listener
	udp    net.PacketConn
	dns    *dns.Server
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	lim     *limiter
	conns   sync.Map     // *idleConn → struct{}: open sandbox connections, for the idle janitor
	h1      *http.Server // relays intercepted and plain-HTTP connections
	h1ln    *chanListener
	h2conns sync.Map // *tls.Conn → *relayConn: HTTP/2 connections the server serves
}

// Start listens on free ports of all host addresses (nftables admits only sandbox traffic to
// them) and serves until Close.
func Start(cfg Config) (*Gateway, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Audit == nil {
		cfg.Audit = NewAudit()
	}
	if cfg.Blocked == nil {
		cfg.Blocked = func() []netip.Prefix { return nil }
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, res: net.DefaultResolver, lim: newLimiter(cfg.Limits)}
	if cfg.Upstream != "" {
		if _, err := netip.ParseAddrPort(cfg.Upstream); err != nil {
			return nil, fmt.Errorf("egress: upstream resolver %q: want ip:port", cfg.Upstream)
		}
		g.res = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, cfg.Upstream)
		}}
	}
	var err error
	if g.roots, err = rootPool(cfg.ExtraRoots); err != nil {
		return nil, fmt.Errorf("egress: SPACE_EGRESS_CA: %w", err)
	}
	if g.tcp, err = net.Listen("tcp4", "0.0.0.0:0"); err != nil {
		return nil, fmt.Errorf("egress: proxy: %w", err)
	}
	if g.udp, err = net.ListenPacket("udp4", "0.0.0.0:0"); err != nil {
		g.tcp.Close()
		return nil, fmt.Errorf("egress: dns: %w", err)
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.dns = &dns.Server{PacketConn: g.udp, Handler: dns.HandlerFunc(g.serveDNS)}
	g.startRelay()
	g.wg.Add(3)
	go g.janitor()
	go func() {
		defer g.wg.Done()
		if err := g.dns.ActivateAndServe(); err != nil && g.ctx.Err() == nil {
			g.log.Error("egress dns stopped", "err", err)
		}
	}()
	go g.acceptLoop()
	g.log.Info("egress gateway listening", "proxy_port", g.ProxyPort(), "dns_port", g.DNSPort(), "upstream", cfg.Upstream)
	return g, nil
}

// ProxyPort is the TCP port of the transparent proxy.
func (g *Gateway) ProxyPort() uint16 { return uint16(g.tcp.Addr().(*net.TCPAddr).Port) }

// DNSPort is the UDP port of the DNS server.
func (g *Gateway) DNSPort() uint16 { return uint16(g.udp.LocalAddr().(*net.UDPAddr).Port) }

// Close stops serving and ends open connections.
func (g *Gateway) Close() error {
	g.cancel()
	g.tcp.Close()
	g.dns.Shutdown()
	g.h1ln.Close()
	g.h1.Close()
	g.conns.Range(func(k, _ any) bool {
		k.(*idleConn).Close()
		return true
	})
	g.wg.Wait()
	return nil
}

func (g *Gateway) acceptLoop() {
	defer g.wg.Done()
	for {
		c, err := g.tcp.Accept()
		if err != nil {
			if g.ctx.Err() != nil {
				return
			}
			// Out of descriptors or another transient error: wait rather than spin.
			g.log.Error("egress proxy accept", "err", err)
			select {
			case <-g.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		// The limits are checked here, before a goroutine holds the descriptor, so that a flood
		// of connections costs spaced no more descriptors than the limits allow.
		tgt, release, ok := g.admit(c)
		if !ok {
			c.Close()
			continue
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer release()
			g.serveConn(c, tgt)
		}()
	}
}

// admit finds the sandbox a new connection comes from and counts it against the limits; release
// gives its place back.
func (g *Gateway) admit(c net.Conn) (Target, func(), bool) {
	if g.lim.total.Add(1) > int64(g.lim.lim.MaxTotalConns) {
		g.lim.total.Add(-1)
		return Target{}, nil, false
	}
	src := addrOf(c.RemoteAddr()).Addr().Unmap()
	tgt, ok := g.cfg.Lookup(src)
	if !ok {
		g.lim.total.Add(-1)
		g.log.Warn("egress connection from an unknown source", "src", src)
		return Target{}, nil, false
	}
	release, why, audit := g.lim.conn(tgt.SandboxID)
	if release == nil {
		g.lim.total.Add(-1)
		if audit {
			ev := Event{SandboxID: tgt.SandboxID, Proto: "tcp", Decision: "deny", Reason: why, Time: time.Now().UTC()}
			if dst, err := originalDst(c); err == nil {
				ev.IP, ev.Port = dst.Addr().String(), int(dst.Port())
			}
			g.cfg.Audit.Record(ev)
		}
		return Target{}, nil, false
	}
	return tgt, func() {
		release()
		g.lim.total.Add(-1)
	}, true
}

// janitor closes sandbox connections silent both ways for longer than the idle limit.
func (g *Gateway) janitor() {
	defer g.wg.Done()
	idle := g.lim.lim.IdleTimeout
	t := time.NewTicker(max(idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case now := <-t.C:
			g.conns.Range(func(k, _ any) bool {
				if c := k.(*idleConn); now.Sub(time.Unix(0, c.last.Load())) > idle {
					c.Close()
				}
				return true
			})
		}
	}
}

func addrOf(a net.Addr) netip.AddrPort {
	switch v := a.(type) {
	case *net.TCPAddr:
		return v.AddrPort()
	case *net.UDPAddr:
		return v.AddrPort()
	}
	return netip.AddrPort{}
}

// serveConn handles one redirected TCP connection from sandbox tgt (admitted).
func (g *Gateway) serveConn(raw net.Conn, tgt Target) {
	defer raw.Close()
	src := addrOf(raw.RemoteAddr()).Addr().Unmap()
	dst, err := originalDst(raw)
	if err != nil {
		g.log.Warn("egress: no original destination", "src", src, "err", err)
		return
	}
	ev := Event{SandboxID: tgt.SandboxID, Port: int(dst.Port()), Proto: "tcp", IP: dst.Addr().String()}
	c := newIdleConn(raw)
	g.conns.Store(c, struct{}{})
	defer g.conns.Delete(c)
	deny := func(reason string, s sniffed) {
		ev.Decision, ev.Reason, ev.Time = "deny", reason, time.Now().UTC()
		g.cfg.Audit.Record(ev)
		if s.kind == "http" {
			body := "blocked by the sandbox's egress policy: " + reason + "\n"
			fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		}
	}

	// The first bytes name the destination: TLS SNI or HTTP Host.
	buf := make([]byte, maxSniff)
	n := 0
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var s sniffed
	for {
		m, err := c.Read(buf[n:])
		n += m
		s = sniff(buf[:n])
		if !s.need || err != nil || n == len(buf) {
			break
		}
	}
	c.SetReadDeadline(time.Time{})
	ev.Host = s.name
	hint := netip.Addr{}
	if s.name == "" {
		hint = dst.Addr() // nothing names a host: only address rules can allow it
	}
	allow, reason := tgt.Policy.Decide(s.name, hint, dst.Port())
	if !allow {
		deny(reason, s)
		return
	}
	ctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	pass, rule := false, ""
	// TLS without a server name (or an address as one) was judged by its address: spliced there.
	if s.kind == "tls" && s.name != "" {
		if pass, rule = tgt.passthrough(s.name, dst.Port()); !pass {
			if g.cfg.CA == nil {
				deny("interception needs a CA and the gateway has none", s)
				return
			}
		} else if s.ech {
			// Spliced, an encrypted inner ClientHello would reach a server that can read it and
			// name another host behind this one; intercepted, the gateway (which publishes no
			// ECH config) answers the outer ClientHello and judges every request itself.
			deny("TLS Encrypted Client Hello to a passthrough name hides the destination", s)
			return
		}
	}
	if s.kind == "http" {
		// Every request is judged on its own Host and sent where that Host resolves.
		ev.Decision, ev.Reason, ev.Time = "allow", reason, time.Now().UTC()
		g.cfg.Audit.Record(ev)
		rc := g.newRelay(src, dst, "", ev)
		rc.seen[s.name] = true
		g.relay(ctx, &prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(buf[:n]), c)}, rc)
		return
	}
	if s.kind == "tls" && s.name != "" && !pass {
		ev.Reason = reason
		g.intercept(ctx, c, buf[:n], src, dst, s.name, ev)
		return
	}
	// Spliced: a passthrough TLS name, or a connection that names no host (allowed by an address
	// rule, and sent only to that address).
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	var ips []netip.Addr
	if s.name != "" {
		ips, err = g.res.LookupNetIP(dctx, "ip4", s.name)
		if err != nil {
			deny("cannot resolve "+s.name+": "+err.Error(), s)
			return
		}
	} else {
		ips = []netip.Addr{dst.Addr()}
	}
	ok4, why := g.dialable(tgt, ips, dst.Port())
	if len(ok4) == 0 {
		deny(why, s)
		return
	}
	var up net.Conn
	var d net.Dialer
	for _, ip := range ok4 {
		ev.IP = ip.String()
		up, err = d.DialContext(dctx, "tcp4", netip.AddrPortFrom(ip, dst.Port()).String())
		if err == nil {
			break
		}
	}
	if err != nil {
		deny("upstream unreachable: "+err.Error(), sniffed{})
		return
	}
	defer up.Close()
	if pass {
		reason = "passthrough (rule " + rule + "), fronting not checked: " + reason
	}
	ev.Decision, ev.Reason, ev.Time = "allow", reason, time.Now().UTC()
	g.cfg.Audit.Record(ev)
	if _, err := up.Write(buf[:n]); err != nil {
		return
	}
	splice(c, up)
}

// splice copies both ways until both directions end (or the idle janitor closes a).
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	half := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	go half(a, b)
	go half(b, a)
	wg.Wait()
}

// originalDst is where the sandbox addressed a connection before nftables redirected it.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// struct sockaddr_in, read through the 16-byte IPv6 mreq getter.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		port := binary.BigEndian.Uint16(b[2:4])
		out = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port)
	})
	if err == nil {
		err = serr
	}
	return out, err
}

// serveDNS answers a sandbox's query: allowed names with their (non-blocked) IPv4 addresses,
// everything else with NXDOMAIN, never asking anyone about a name the policy does not allow.
func (g *Gateway) serveDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	defer w.WriteMsg(m)
	src := addrOf(w.RemoteAddr()).Addr().Unmap()
	tgt, ok := g.cfg.Lookup(src)
	if !ok || len(r.Question) != 1 {
		m.Rcode = dns.RcodeRefused
		return
	}
	if ok, audit := g.lim.query(tgt.SandboxID); !ok {
		m.Rcode = dns.RcodeRefused
		if audit {
			g.cfg.Audit.Record(Event{SandboxID: tgt.SandboxID, Host: r.Question[0].Name, Port: 53, Proto: "dns",
				Decision: "deny", Reason: "too many DNS queries per second", Time: time.Now().UTC()})
		}
		return
	}
	q := r.Question[0]
	name := NormalizeName(q.Name)
	ev := Event{SandboxID: tgt.SandboxID, Host: name, Port: 53, Proto: "dns"}
	if name == "" {
		ev.Host = q.Name
	}
	record := func(decision, reason string) {
		ev.Decision, ev.Reason, ev.Time = decision, reason, time.Now().UTC()
		g.cfg.Audit.Record(ev)
	}
	if name == "" || !tgt.Policy.MayResolve(name) {
		m.Rcode = dns.RcodeNameError
		record("deny", "name not allowed; not resolved")
		return
	}
	if q.Qtype != dns.TypeA {
		return // NOERROR, no records: only IPv4 is routed, and only addresses are answered
	}
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	ips, err := g.res.LookupNetIP(ctx, "ip4", name)
	if err != nil {
		m.Rcode = dns.RcodeNameError
		record("deny", "cannot resolve: "+err.Error())
		return
	}
	usable, why := g.dialable(tgt, ips, 0)
	if len(usable) == 0 {
		m.Rcode = dns.RcodeNameError
		record("deny", why)
		return
	}
	for _, ip := range usable {
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
			A:   ip.AsSlice(),
		})
	}
	ev.IP = usable[0].String()
	record("allow", "resolved")
}

// dialable is usable less the addresses the sandbox's deny rules refuse at port (0: only
// port-less rules, for DNS answers).
func (g *Gateway) dialable(tgt Target, ips []netip.Addr, port uint16) ([]netip.Addr, string) {
	ok, why := g.usable(ips)
	out := ok[:0]
	for _, ip := range ok {
		if denied, r := tgt.Policy.DenyAddr(ip, port); denied {
			why = r
			continue
		}
		out = append(out, ip)
	}
	return out, why
}

// usable returns the addresses of ips the gateway may dial (unmapped), and why the last refused
// one was refused. The host's own addresses are looked up once per call.
func (g *Gateway) usable(ips []netip.Addr) ([]netip.Addr, string) {
	host := g.cfg.Blocked()
	var ok []netip.Addr
	var why string
	for _, ip := range ips {
		if r := blockedReason(ip, host); r != "" {
			why = r
			continue
		}
		ok = append(ok, ip.Unmap())
	}
	return ok, why
}
