package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Credential is a header the gateway sets on intercepted requests to Hosts (rules as in
// policies), replacing whatever the sandbox sent.
type Credential struct {
	Name   string
	Hosts  []Rule
	Header string
	Value  string
}

// credentialsFor returns the credentials that apply to host.
func (t Target) credentialsFor(host string, port uint16) []Credential {
	var out []Credential
	for _, c := range t.Credentials {
		for _, r := range c.Hosts {
			if r.matches(host, netip.Addr{}, port) {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// passthrough reports whether a TLS connection to name is spliced end to end instead of
// intercepted: only when the policy lists the name under passthrough (clients that pin
// certificates), and never for a host a credential applies to (injection needs interception).
func (t Target) passthrough(name string, port uint16) (bool, string) {
	if name == "" || len(t.credentialsFor(name, port)) > 0 {
		return false, ""
	}
	for _, r := range t.Passthrough {
		if r.matches(name, netip.Addr{}, port) {
			return true, r.String()
		}
	}
	return false, ""
}

// prefixConn replays bytes already read from a connection before reading on.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// relayConn is one sandbox connection relayed as HTTP: what it was judged by when it opened,
// and the upstream connections (a transport of its own: nothing is shared between sandboxes or
// connections) and resolved addresses it uses.
type relayConn struct {
	g    *Gateway
	done chan struct{} // closed when the HTTP server is done with the connection
	src  netip.Addr
	dst  netip.AddrPort
	sni  string // the TLS server name; "" for plain HTTP
	ev   Event  // the connection's event, for per-request ones
	tr   *http.Transport
	rp   *httputil.ReverseProxy

	mu     sync.Mutex
	routes map[string][]netip.Addr // "host:port" dialled → the addresses allowed for it
	seen   map[string]bool         // hosts whose allow is already recorded for this connection
}

type relayKey struct{}

// reqInfo is what the handler decided about one request, for the proxy's rewrite.
type reqInfo struct {
	addr  string // "host:port" to dial (a routes key)
	creds []Credential
}

type reqKey struct{}

// newRelay returns the relay of one sandbox connection.
func (g *Gateway) newRelay(src netip.Addr, dst netip.AddrPort, sni string, ev Event) *relayConn {
	rc := &relayConn{g: g, done: make(chan struct{}), src: src, dst: dst, sni: sni, ev: ev, routes: map[string][]netip.Addr{}, seen: map[string]bool{}}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	rc.tr = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			rc.mu.Lock()
			ips := rc.routes[addr]
			rc.mu.Unlock()
			_, port, _ := net.SplitHostPort(addr)
			err := fmt.Errorf("no allowed address for %s", addr)
			for _, ip := range ips {
				var c net.Conn
				if c, err = dialer.DialContext(ctx, "tcp4", net.JoinHostPort(ip.String(), port)); err == nil {
					return c, nil
				}
			}
			return nil, err
		},
		TLSClientConfig:       &tls.Config{RootCAs: g.roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		MaxIdleConns:          4,
		MaxIdleConnsPerHost:   2,
		MaxConnsPerHost:       4, // an HTTP/2 connection's streams do not fan out without bound
		IdleConnTimeout:       90 * time.Second,
	}
	scheme := "http"
	if sni != "" {
		scheme = "https"
	}
	rc.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			ri := pr.In.Context().Value(reqKey{}).(reqInfo)
			pr.Out.URL.Scheme, pr.Out.URL.Host = scheme, ri.addr
			pr.Out.Host = pr.In.Host
			for _, c := range ri.creds {
				pr.Out.Header.Set(c.Header, c.Value) // replaces the sandbox's own value
			}
		},
		Transport:     rc.tr,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			rc.record("deny", "upstream for "+r.Host+" failed: "+err.Error(), hostName(splitHost(r.Host)))
			refuse(w, r, http.StatusBadGateway, "upstream failed: "+err.Error())
		},
	}
	return rc
}

func (rc *relayConn) record(decision, reason, host string) {
	ev := rc.ev
	if host != "" {
		ev.Host = host
	}
	ev.Decision, ev.Reason, ev.Time = decision, reason, time.Now().UTC()
	rc.g.cfg.Audit.Record(ev)
}

// refuse answers a request the gateway will not relay, and ends an HTTP/1 connection after it.
func refuse(w http.ResponseWriter, r *http.Request, code int, reason string) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintf(w, "refused by the egress gateway: %s\n", reason)
}

// ServeHTTP relays one request the gateway allows (judge), and refuses the others.
func (rc *relayConn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ri, code, reason := rc.judge(r)
	if code != 0 {
		refuse(w, r, code, reason)
		return
	}
	rc.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), reqKey{}, ri)))
}

// judge decides one request by its own Host (:authority in HTTP/2) against the sandbox's
// policy as it is now: for TLS the Host must be the connection's server name (421 otherwise:
// domain fronting), and a plain-HTTP request goes to the host it names, never to the address
// the sandbox chose; deny rules by address apply to what the name resolves to. It returns where
// to send the request, or the status and reason of a refusal (recorded in the audit log).
func (rc *relayConn) judge(r *http.Request) (reqInfo, int, string) {
	tgt, ok := rc.g.cfg.Lookup(rc.src)
	if !ok {
		return reqInfo{}, http.StatusForbidden, "unknown sandbox"
	}
	name := hostName(splitHost(r.Host))
	port := rc.dst.Port()
	if r.Method == http.MethodConnect {
		// A tunnel through an allowed host's server would carry anything; the gateway is no
		// forward proxy either.
		rc.record("deny", "CONNECT is not relayed", name)
		return reqInfo{}, http.StatusMethodNotAllowed, "CONNECT is not relayed"
	}
	if rc.sni != "" && name != rc.sni {
		rc.record("deny", fmt.Sprintf("Host %q does not match the TLS server name %q (domain fronting)", r.Host, rc.sni), rc.sni)
		return reqInfo{}, http.StatusMisdirectedRequest, "Host does not match the TLS server name"
	}
	hint := netip.Addr{}
	if name == "" {
		hint = rc.dst.Addr() // an address or no Host: only address rules can allow it
	}
	allow, reason := tgt.Policy.Decide(name, hint, port)
	if !allow {
		rc.record("deny", reason, name)
		return reqInfo{}, http.StatusForbidden, reason
	}
	addr, why := rc.route(r.Context(), tgt, name, port)
	if addr == "" {
		rc.record("deny", why, name)
		return reqInfo{}, http.StatusForbidden, why
	}
	rc.mu.Lock()
	first := !rc.seen[name]
	rc.seen[name] = true
	rc.mu.Unlock()
	if first {
		rc.record("allow", reason, name) // once per host and connection, not per request
	}
	ri := reqInfo{addr: addr}
	if rc.sni != "" {
		ri.creds = tgt.credentialsFor(name, port) // TLS only, after the upstream verified for name
	}
	return ri, 0, ""
}

// route resolves the request's host once per connection and returns the transport's dial key,
// or "" and why no address may be dialled.
func (rc *relayConn) route(ctx context.Context, tgt Target, name string, port uint16) (string, string) {
	key := net.JoinHostPort(name, strconv.Itoa(int(port)))
	if name == "" {
		key = rc.dst.String()
	}
	rc.mu.Lock()
	_, done := rc.routes[key]
	rc.mu.Unlock()
	if done {
		return key, ""
	}
	var ips []netip.Addr
	if name == "" {
		ips = []netip.Addr{rc.dst.Addr()}
	} else {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		if ips, err = rc.g.res.LookupNetIP(ctx, "ip4", name); err != nil {
			return "", "cannot resolve " + name + ": " + err.Error()
		}
	}
	ok, why := rc.g.dialable(tgt, ips, port)
	if len(ok) == 0 {
		return "", why
	}
	rc.mu.Lock()
	rc.routes[key] = ok
	rc.mu.Unlock()
	return key, ""
}

// notifyConn tells when the HTTP/1 server is done with a connection (closed, also after a
// WebSocket upgrade the proxy hijacked), and carries the relay to the handler.
type notifyConn struct {
	net.Conn
	rc   *relayConn
	once sync.Once
}

func (c *notifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.rc.done) })
	return err
}

// chanListener hands connections to the gateway's HTTP/1 server.
type chanListener struct {
	c      chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{c: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{} }

// startRelay starts the HTTP server the gateway relays intercepted and plain-HTTP connections
// through (net/http, with its HTTP/2 for connections that negotiate h2).
func (g *Gateway) startRelay() {
	idle := g.lim.lim.IdleTimeout
	g.h1 = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Context().Value(relayKey{}).(*relayConn).ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if nc, ok := c.(*notifyConn); ok {
				return context.WithValue(ctx, relayKey{}, nc.rc)
			}
			rc, _ := g.h2conns.Load(c)
			return context.WithValue(ctx, relayKey{}, rc)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if st != http.StateClosed {
				return
			}
			if rc, ok := g.h2conns.LoadAndDelete(c); ok {
				close(rc.(*relayConn).done)
			}
		},
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       idle,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: 100},
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	g.h1ln = newChanListener()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.h1.Serve(g.h1ln)
	}()
}

// relay serves conn (the sandbox's side, TLS already terminated when rc.sni is set) as HTTP
// until it ends: HTTP/2 when the sandbox negotiated it (net/http needs the *tls.Conn itself for
// that), else HTTP/1.1 with keep-alive, Expect: 100-continue and upgrades.
func (g *Gateway) relay(ctx context.Context, conn net.Conn, rc *relayConn) {
	defer rc.tr.CloseIdleConnections()
	var give net.Conn = &notifyConn{Conn: conn, rc: rc}
	if tc, ok := conn.(*tls.Conn); ok && tc.ConnectionState().NegotiatedProtocol == "h2" {
		g.h2conns.Store(tc, rc)
		give = tc
	}
	select {
	case g.h1ln.c <- give:
	case <-ctx.Done():
		g.h2conns.Delete(give)
		return
	}
	select {
	case <-rc.done:
	case <-ctx.Done():
		give.Close()
		select {
		case <-rc.done:
		case <-time.After(5 * time.Second):
		}
	}
}

// intercept terminates the sandbox's TLS with a certificate for name from the installation CA
// and relays its requests (relayConn.ServeHTTP) to the real host over TLS verified for name.
func (g *Gateway) intercept(ctx context.Context, c net.Conn, first []byte, src netip.Addr, dst netip.AddrPort, name string, ev Event) {
	cs := tls.Server(&prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(first), c)}, &tls.Config{
		NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hostName(hello.ServerName) != name {
				return nil, fmt.Errorf("SNI %q changed", hello.ServerName)
			}
			return g.cfg.CA.leaf(name)
		},
	})
	rc := g.newRelay(src, dst, name, ev)
	cs.SetDeadline(time.Now().Add(15 * time.Second))
	hctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err := cs.HandshakeContext(hctx)
	cancel()
	if err != nil {
		rc.record("deny", "TLS with the sandbox failed: "+err.Error(), "")
		return
	}
	cs.SetDeadline(time.Time{})
	rc.seen[name] = true
	rc.record("allow", "intercepted: "+ev.Reason, "")
	g.relay(ctx, cs, rc)
}

// rootPool is the system roots plus extra PEM certificates (SPACE_EGRESS_CA).
func rootPool(extra []byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(bytes.TrimSpace(extra)) > 0 && !pool.AppendCertsFromPEM(extra) {
		return nil, fmt.Errorf("no certificate in the extra roots")
	}
	return pool, nil
}
