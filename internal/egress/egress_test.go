package egress

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPolicy(t *testing.T) {
	p, err := NewPolicy("deny", []string{"api.example.com", "*.pypi.org", "203.0.113.0/24:443", "git.example.com:22"}, []string{"bad.pypi.org"})
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("203.0.113.7")
	for _, tt := range []struct {
		host string
		ip   netip.Addr
		port uint16
		want bool
	}{
		{"api.example.com", netip.Addr{}, 443, true},
		{"API.example.com", netip.Addr{}, 443, false}, // callers normalize; Decide does not
		{"x.api.example.com", netip.Addr{}, 443, false},
		{"files.pypi.org", netip.Addr{}, 443, true},
		{"pypi.org", netip.Addr{}, 443, false}, // a wildcard is below the name only
		{"bad.pypi.org", netip.Addr{}, 443, false},
		{"", ip, 443, true},
		{"", ip, 80, false},
		{"git.example.com", netip.Addr{}, 22, true},
		{"git.example.com", netip.Addr{}, 443, false},
		{"other.com", netip.Addr{}, 443, false},
	} {
		if got, why := p.Decide(tt.host, tt.ip, tt.port); got != tt.want {
			t.Errorf("Decide(%q, %v, %d) = %v (%s), want %v", tt.host, tt.ip, tt.port, got, why, tt.want)
		}
	}
	if !p.MayResolve("files.pypi.org") || p.MayResolve("bad.pypi.org") || p.MayResolve("other.com") || !p.MayResolve("git.example.com") {
		t.Error("MayResolve disagrees with the rules")
	}
	open, _ := NewPolicy("allow", nil, []string{"*.evil.test"})
	if ok, _ := open.Decide("x.evil.test", netip.Addr{}, 443); ok {
		t.Error("deny rule lost under default allow")
	}
	if ok, _ := open.Decide("fine.test", netip.Addr{}, 443); !ok || !open.MayResolve("fine.test") {
		t.Error("default allow not applied")
	}
	for _, bad := range []string{"", "exa mple.com", "-x.com", "1.2.3.4/40", "host:0", "host:99999", "::1/128"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}

func TestBlocked(t *testing.T) {
	host := []netip.Prefix{netip.MustParsePrefix("198.51.100.9/32")}
	for ip, blocked := range map[string]bool{
		"10.1.2.3": true, "172.16.0.1": true, "192.168.1.1": true, "127.0.0.1": true,
		"169.254.169.254": true, "100.64.0.1": true, "224.0.0.1": true, "255.255.255.255": true,
		"0.0.0.0": true, "::1": true, "2001:db8::1": true, "198.51.100.9": true,
		"203.0.113.10": false, "198.51.100.10": false, "8.8.8.8": false,
	} {
		if got := blockedReason(netip.MustParseAddr(ip), host) != ""; got != blocked {
			t.Errorf("%s: blocked %v, want %v", ip, got, blocked)
		}
	}
}

// clientHello returns the first flight of a real TLS client.
func clientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c1, c2 := net.Pipe()
	go func() {
		tls.Client(c1, cfg).Handshake()
		c1.Close()
	}()
	buf := make([]byte, 64<<10)
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got []byte
	for {
		n, err := c2.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil || !sniff(got).need {
			break
		}
	}
	c2.Close()
	return got
}

func TestSniff(t *testing.T) {
	hello := clientHello(t, &tls.Config{ServerName: "Allowed.Test"})
	if s := sniff(hello); s.kind != "tls" || s.name != "allowed.test" || s.ech || s.need {
		t.Fatalf("TLS: %+v", s)
	}
	for i := 1; i < len(hello); i += 97 {
		if s := sniff(hello[:i]); !s.need {
			t.Fatalf("prefix of %d bytes decided: %+v", i, s)
		}
	}
	if s := sniff(clientHello(t, &tls.Config{InsecureSkipVerify: true})); s.kind != "tls" || s.name != "" {
		t.Fatalf("TLS without SNI: %+v", s)
	}
	req := []byte("GET /x HTTP/1.1\r\nHost: Example.COM:8080\r\nUser-Agent: t\r\n\r\n")
	if s := sniff(req); s.kind != "http" || s.name != "example.com" {
		t.Fatalf("HTTP: %+v", s)
	}
	if s := sniff(req[:20]); !s.need {
		t.Fatalf("partial HTTP decided: %+v", s)
	}
	if s := sniff([]byte("GET / HTTP/1.1\r\nHost: 203.0.113.20\r\n\r\n")); s.kind != "http" || s.name != "" {
		t.Fatalf("HTTP to an address: %+v", s)
	}
	if s := sniff([]byte("SSH-2.0-OpenSSH\r\n")); s.kind != "" || s.need {
		t.Fatalf("SSH: %+v", s)
	}
}

func FuzzSniff(f *testing.F) {
	// A real ClientHello, kept small (X25519 only, no post-quantum key share): the fuzzer
	// made no progress past its first seconds from the 1.5 KB default one.
	f.Add(clientHello(f, &tls.Config{ServerName: "a.example.com", CurvePreferences: []tls.CurveID{tls.X25519}}))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0})
	f.Add([]byte("GET / HTTP/1.1\r\nHost: 203.0.113.20.:80\r\n\r\n"))
	f.Add([]byte("POST /x HTTP/1.1\r\nHost: [::1]:8080\r\nExpect: 100-continue\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := sniff(b)
		if s.name != "" && NormalizeName(s.name) != s.name {
			t.Fatalf("name %q not normalized", s.name)
		}
		if s.name != "" && hostName(s.name) != s.name {
			t.Fatalf("name %q is an address", s.name) // an address is never a name to resolve
		}
		if s.need && len(b) >= maxSniff {
			t.Fatalf("asks for more than maxSniff bytes")
		}
		if s.kind == "" && s.name != "" {
			t.Fatalf("a name without a protocol: %+v", s)
		}
		// More bytes never make a decided TLS sniff forget its name.
		if s.kind == "tls" && !s.need && s.name != "" {
			if again := sniff(append(append([]byte{}, b...), 0x17, 3, 3, 0, 1, 0)); again.name != s.name {
				t.Fatalf("trailing record changed the name: %q → %q", s.name, again.name)
			}
		}
	})
}

// withExtension returns a single-record ClientHello with one more extension appended.
func withExtension(t *testing.T, hello []byte, typ uint16, body []byte) []byte {
	t.Helper()
	rec := hello[5 : 5+(int(hello[3])<<8|int(hello[4]))]
	hs := rec[4:]
	r := reader(hs)
	r.skip(2 + 32)
	r.vec(1)
	r.vec(2)
	r.vec(1)
	extStart := len(hs) - len(r)
	ext := append([]byte{}, hs[extStart+2:]...)
	ext = append(ext, byte(typ>>8), byte(typ), byte(len(body)>>8), byte(len(body)))
	ext = append(ext, body...)
	newHS := append(append([]byte{}, hs[:extStart]...), byte(len(ext)>>8), byte(len(ext)))
	newHS = append(newHS, ext...)
	msg := append([]byte{1, byte(len(newHS) >> 16), byte(len(newHS) >> 8), byte(len(newHS))}, newHS...)
	return append([]byte{0x16, hello[1], hello[2], byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

func TestSniffECH(t *testing.T) {
	hello := clientHello(t, &tls.Config{ServerName: "public.example"})
	ech := withExtension(t, hello, 0xfe0d, []byte{0, 1, 2, 3})
	if s := sniff(ech); !s.ech || s.name != "public.example" {
		t.Fatalf("ClientHello with ECH: %+v", s)
	}
	if s := sniff(withExtension(t, hello, 0x1234, nil)); s.ech || s.name != "public.example" {
		t.Fatalf("ClientHello with another extension: %+v", s)
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"api.example.com", "*.pypi.org:443", "203.0.113.0/24", "1.2.3.4:22", "x:", ":80", "a..b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		// A rule that parses prints as a rule that parses to itself.
		again, err := ParseRule(r.String())
		if err != nil || again != r {
			t.Fatalf("%q → %q → %+v, %v", s, r.String(), again, err)
		}
	})
}

func TestDenyAddr(t *testing.T) {
	p, err := NewPolicy("allow", nil, []string{"203.0.113.20/32", "198.51.100.0/24:443", "evil.test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		ip   string
		port uint16
		want bool
	}{
		{"203.0.113.20", 443, true}, {"203.0.113.20", 0, true}, {"::ffff:203.0.113.20", 80, true},
		{"203.0.113.10", 443, false}, {"198.51.100.7", 443, true}, {"198.51.100.7", 80, false},
		{"198.51.100.7", 0, false}, // a DNS answer: only port-less rules refuse it
	} {
		if got, why := p.DenyAddr(netip.MustParseAddr(tt.ip), tt.port); got != tt.want {
			t.Errorf("DenyAddr(%s, %d) = %v (%s), want %v", tt.ip, tt.port, got, why, tt.want)
		}
	}
}

func TestAddressLiterals(t *testing.T) {
	// An address with a trailing dot is an address, in SNI/Host and in rules alike.
	for _, s := range []string{"203.0.113.20", "203.0.113.20.", "[::1]", "::1"} {
		if n := hostName(s); n != "" {
			t.Errorf("hostName(%q) = %q, want an address (\"\")", s, n)
		}
	}
	if s := sniff([]byte("GET / HTTP/1.1\r\nHost: 203.0.113.20.:80\r\n\r\n")); s.kind != "http" || s.name != "" {
		t.Errorf("Host with a trailing-dot address: %+v", s)
	}
	if s := sniff(clientHello(t, &tls.Config{ServerName: "203.0.113.20."})); s.name != "" {
		t.Errorf("SNI with a trailing-dot address: %+v", s)
	}
	r, err := ParseRule("203.0.113.20.")
	if err != nil || r.Host != "" || r.Prefix != netip.MustParsePrefix("203.0.113.20/32") {
		t.Errorf("ParseRule of a trailing-dot address: %+v %v", r, err)
	}
	if splitHost("[::1]:80") != "[::1]" || splitHost("a.test:8080") != "a.test" || splitHost("a.test") != "a.test" {
		t.Error("splitHost")
	}
}

func TestSniffGreaseECH(t *testing.T) {
	// GREASE ECH (RFC 9849 §6.2): an outer ECHClientHello with a random config_id, enc and
	// payload — what Chromium sends to every server. It still names the host in the outer SNI.
	body := []byte{0, 0, 1, 0, 1, 0x5a, 0, 32}
	body = append(body, make([]byte, 32)...)
	body = append(body, 0, 16)
	body = append(body, make([]byte, 16)...)
	s := sniff(withExtension(t, clientHello(t, &tls.Config{ServerName: "allowed.test"}), 0xfe0d, body))
	if s.kind != "tls" || s.name != "allowed.test" || !s.ech {
		t.Fatalf("GREASE ECH: %+v", s)
	}
}

func TestLimiter(t *testing.T) {
	l := newLimiter(Limits{MaxConns: 3, ConnRate: 1, ConnBurst: 5, DNSRate: 1, DNSBurst: 2})
	var rel []func()
	for i := range 3 {
		r, why, _ := l.conn("a")
		if r == nil {
			t.Fatalf("connection %d refused: %s", i, why)
		}
		rel = append(rel, r)
	}
	if r, why, audit := l.conn("a"); r != nil || why == "" || !audit {
		t.Fatalf("fourth open connection admitted (%q, audit %v)", why, audit)
	}
	if _, _, audit := l.conn("a"); audit {
		t.Error("a second refusal within a second is audited again")
	}
	if r, _, _ := l.conn("b"); r == nil {
		t.Fatal("another sandbox is limited by the first one's connections")
	}
	rel[0]()
	rel[0]() // twice is once
	if r, _, _ := l.conn("a"); r == nil {
		t.Fatal("a released slot is not reusable")
	}
	rel[1]()
	rel[2]()
	// The burst of 5 is spent (4 admitted, one refused at the cap took none): one more, then the rate.
	if r, _, _ := l.conn("a"); r == nil {
		t.Fatal("burst not honoured")
	}
	if r, why, _ := l.conn("a"); r != nil || !strings.Contains(why, "per second") {
		t.Fatalf("new connections above the rate admitted: %q", why)
	}
	if ok, _ := l.query("a"); !ok {
		t.Fatal("first query refused")
	}
	l.query("a")
	if ok, _ := l.query("a"); ok {
		t.Fatal("queries above the burst admitted")
	}
}

// testRelay is a relay of a sandbox connection at 10.0.0.2 to dst whose policy is p, with
// allowed.test already resolved to 203.0.113.10 (judge does not resolve it again).
func testRelay(t testing.TB, p Policy, sni string, dst netip.AddrPort) (*relayConn, *Audit) {
	audit := NewAudit()
	g := &Gateway{cfg: Config{Audit: audit, Blocked: func() []netip.Prefix { return nil },
		Lookup: func(netip.Addr) (Target, bool) { return Target{SandboxID: "sb", Policy: p}, true }}}
	rc := g.newRelay(netip.MustParseAddr("10.0.0.2"), dst, sni, Event{SandboxID: "sb"})
	rc.routes[net.JoinHostPort("allowed.test", strconv.Itoa(int(dst.Port())))] = []netip.Addr{netip.MustParseAddr("203.0.113.10")}
	return rc, audit
}

func TestJudge(t *testing.T) {
	p, err := NewPolicy("deny", []string{"allowed.test", "203.0.113.0/24:80"}, []string{"203.0.113.66/32"})
	if err != nil {
		t.Fatal(err)
	}
	tlsDst, plainDst := netip.MustParseAddrPort("203.0.113.10:443"), netip.MustParseAddrPort("203.0.113.10:80")
	for _, tt := range []struct {
		sni, host string
		dst       netip.AddrPort
		code      int
		addr      string
	}{
		{"allowed.test", "allowed.test", tlsDst, 0, "allowed.test:443"},
		{"allowed.test", "Allowed.Test.:443", tlsDst, 0, "allowed.test:443"},
		{"allowed.test", "denied.test", tlsDst, 421, ""},  // fronting: another Host behind the SNI
		{"allowed.test", "203.0.113.10", tlsDst, 421, ""}, // an address is not the SNI either
		{"allowed.test", "", tlsDst, 421, ""},
		{"", "allowed.test", plainDst, 0, "allowed.test:80"},
		{"", "denied.test", plainDst, 403, ""},
		{"", "203.0.113.10", plainDst, 0, "203.0.113.10:80"},  // judged by the address, sent there
		{"", "203.0.113.66.", plainDst, 0, "203.0.113.10:80"}, // only a header: sent where addressed
	} {
		rc, audit := testRelay(t, p, tt.sni, tt.dst)
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = tt.host
		ri, code, why := rc.judge(r)
		if code != tt.code || ri.addr != tt.addr {
			t.Errorf("sni %q Host %q: %d %q (%s), want %d %q", tt.sni, tt.host, code, ri.addr, why, tt.code, tt.addr)
		}
		if ev := audit.Events("sb"); len(ev) != 1 || (ev[0].Decision == "deny") != (tt.code != 0) {
			t.Errorf("sni %q Host %q: audit %+v", tt.sni, tt.host, ev)
		}
	}
	rc, _ := testRelay(t, p, "", plainDst)
	r := httptest.NewRequest("CONNECT", "allowed.test:443", nil)
	if _, code, _ := rc.judge(r); code != http.StatusMethodNotAllowed {
		t.Errorf("CONNECT through an allowed host: %d", code)
	}
	// A denied address stays denied when named: 203.0.113.66 is what deny66.test resolves to.
	if ips, why := rc.g.dialable(Target{Policy: p}, []netip.Addr{netip.MustParseAddr("203.0.113.66")}, 80); len(ips) != 0 || !strings.Contains(why, "denied by rule") {
		t.Errorf("dialable of a denied address: %v %q", ips, why)
	}
}

// BenchmarkJudge is the cost of the checks every request pays on a kept-alive intercepted
// connection (the sandbox's policy looked up again, Host against SNI, the policy, the cached
// route, the credentials), without the relaying itself.
func BenchmarkJudge(b *testing.B) {
	p, _ := NewPolicy("deny", []string{"pypi.org", "*.pythonhosted.org", "allowed.test", "github.com", "*.githubusercontent.com"}, []string{"203.0.113.66/32"})
	rc, _ := testRelay(b, p, "allowed.test", netip.MustParseAddrPort("203.0.113.10:443"))
	r := httptest.NewRequest("GET", "/", nil)
	r.Host = "allowed.test"
	for b.Loop() {
		if _, code, _ := rc.judge(r); code != 0 {
			b.Fatal(code)
		}
	}
}

func TestPassthrough(t *testing.T) {
	rules, err := ParseRules([]string{"*.pinned.test", "app.test:8443"})
	if err != nil {
		t.Fatal(err)
	}
	cred := Credential{Name: "k", Hosts: []Rule{{Host: "api.pinned.test"}}, Header: "Authorization", Value: "v"}
	tgt := Target{Passthrough: rules, Credentials: []Credential{cred}}
	for _, tt := range []struct {
		name string
		port uint16
		want bool
	}{
		{"cdn.pinned.test", 443, true}, {"app.test", 8443, true}, {"app.test", 443, false},
		{"pinned.test", 443, false}, {"", 443, false},
		{"api.pinned.test", 443, false}, // a credential applies: intercepted to inject it
	} {
		if got, _ := tgt.passthrough(tt.name, tt.port); got != tt.want {
			t.Errorf("passthrough(%q, %d) = %v, want %v", tt.name, tt.port, got, tt.want)
		}
	}
	if _, err := ParseRules([]string{"ok.test", "not a name"}); err == nil {
		t.Error("a bad passthrough entry parsed")
	}
}

func TestIdleJanitor(t *testing.T) {
	g := &Gateway{lim: newLimiter(Limits{IdleTimeout: 250 * time.Millisecond})}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	a, b := net.Pipe()
	defer b.Close()
	quiet, busy := newIdleConn(a), newIdleConn(&fakeConn{})
	g.conns.Store(quiet, struct{}{})
	g.conns.Store(busy, struct{}{})
	g.wg.Add(1)
	go g.janitor()
	stop := time.Now().Add(time.Second)
	for time.Now().Before(stop) {
		busy.Write([]byte("x")) // activity keeps it open
		time.Sleep(5 * time.Millisecond)
	}
	g.cancel()
	g.wg.Wait()
	if _, err := b.Write([]byte("x")); err == nil {
		t.Error("a connection silent past the idle limit is still open")
	}
	if busy.Conn.(*fakeConn).closed {
		t.Error("a busy connection was closed as idle")
	}
}

// fakeConn is a connection that accepts writes and records Close.
type fakeConn struct {
	net.Conn
	closed bool
}

func (c *fakeConn) Write(b []byte) (int, error) { return len(b), nil }
func (c *fakeConn) Close() error                { c.closed = true; return nil }
