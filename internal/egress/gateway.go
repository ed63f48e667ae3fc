package egress

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// Target is the sandbox a connection or query comes from, and its policy.
type Target struct {
	SandboxID   string
	Policy      Policy
	Inspect     bool         // intercept every TLS connection (the policy asks for inspection)
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
	g := &Gateway{cfg: cfg, log: cfg.Logger, res: net.DefaultResolver}
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
	g.wg.Add(2)
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
	g.wg.Wait()
	return nil
}

func (g *Gateway) acceptLoop() {
	defer g.wg.Done()
	for {
		c, err := g.tcp.Accept()
		if err != nil {
			if g.ctx.Err() == nil {
				g.log.Error("egress proxy accept", "err", err)
			}
			return
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.serveConn(c)
		}()
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

// serveConn handles one redirected TCP connection from a sandbox.
func (g *Gateway) serveConn(c net.Conn) {
	defer c.Close()
	src := addrOf(c.RemoteAddr()).Addr().Unmap()
	tgt, ok := g.cfg.Lookup(src)
	if !ok {
		g.log.Warn("egress connection from an unknown source", "src", src)
		return
	}
	dst, err := originalDst(c)
	if err != nil {
		g.log.Warn("egress: no original destination", "src", src, "err", err)
		return
	}
	ev := Event{SandboxID: tgt.SandboxID, Port: int(dst.Port()), Proto: "tcp", IP: dst.Addr().String()}
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
	if s.ech {
		deny("TLS Encrypted Client Hello hides the destination", s)
		return
	}
	hint := netip.Addr{}
	if s.name == "" {
		hint = dst.Addr() // nothing names a host: only address rules can allow it
	}
	allow, reason := tgt.Policy.Decide(s.name, hint, dst.Port())
	if !allow {
		deny(reason, s)
		return
	}
	ctx, cancel := context.WithTimeout(g.ctx, 10*time.Second)
	defer cancel()
	var ips []netip.Addr
	if s.name != "" {
		ips, err = g.res.LookupNetIP(ctx, "ip4", s.name)
		if err != nil {
			deny("cannot resolve "+s.name+": "+err.Error(), s)
			return
		}
	} else {
		ips = []netip.Addr{dst.Addr()}
	}
	ok4, why := g.usable(ips)
	if len(ok4) == 0 {
		deny(why, s)
		return
	}
	if s.kind == "tls" && tgt.inspect(s.name, dst.Port()) {
		if g.cfg.CA == nil {
			deny("inspection asked for but the gateway has no CA", s)
			return
		}
		g.intercept(ctx, c, buf[:n], s.name, ok4, dst.Port(), tgt, ev)
		return
	}
	var up net.Conn
	var d net.Dialer
	for _, ip := range ok4 {
		ev.IP = ip.String()
		up, err = d.DialContext(ctx, "tcp4", netip.AddrPortFrom(ip, dst.Port()).String())
		if err == nil {
			break
		}
	}
	if err != nil {
		deny("upstream unreachable: "+err.Error(), sniffed{})
		return
	}
	defer up.Close()
	ev.Decision, ev.Reason, ev.Time = "allow", reason, time.Now().UTC()
	g.cfg.Audit.Record(ev)
	if _, err := up.Write(buf[:n]); err != nil {
		return
	}
	splice(c, up)
}

// splice copies both ways until both directions end.
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
	usable, why := g.usable(ips)
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
