package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// httpsClient is run by python3 both on the host and in sandboxes, so that both sides of a
// comparison pay for the same client: n fresh HTTPS connections to allowed.test (median
// latency, after a warm-up), or 8 threads for n seconds (requests per second).
const httpsClient = `
import json, socket, ssl, sys, threading, time
mode, n, cafile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=None if cafile == '-' else cafile)
def one():
    t0 = time.perf_counter()
    raw = socket.create_connection(('203.0.113.10', 443), timeout=10)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s = ctx.wrap_socket(raw, server_hostname='allowed.test')
    s.sendall(b'GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n')
    body = b''
    while True:
        b = s.recv(4096)
        if not b: break
        body += b
    s.close()
    if b'internet:203.0.113.10:allowed.test' not in body: raise Exception('wrong answer: %r' % body[:200])
    return time.perf_counter() - t0
def keepalive(n):
    # One connection, n requests one after another: what each request costs once connected.
    raw = socket.create_connection(('203.0.113.10', 443), timeout=10)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s = ctx.wrap_socket(raw, server_hostname='allowed.test')
    f = s.makefile('rb')
    ts = []
    for i in range(n + 3):
        t0 = time.perf_counter()
        s.sendall(b'GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n')
        length = 0
        while True:
            line = f.readline()
            if line in (b'\r\n', b''): break
            if line.lower().startswith(b'content-length:'): length = int(line.split(b':')[1])
        body = f.read(length)
        if b'internet:203.0.113.10:allowed.test' not in body: raise Exception('wrong answer: %r' % body[:200])
        if i >= 3: ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1000
if mode == 'latency':
    for _ in range(3): one()
    ts = sorted(one() for _ in range(n))
    print(json.dumps({'median_ms': ts[len(ts) // 2] * 1000}))
elif mode == 'keepalive':
    print(json.dumps({'median_ms': keepalive(n)}))
else:
    count, stop, lock = [0], time.time() + n, threading.Lock()
    def worker():
        while time.time() < stop:
            one()
            with lock: count[0] += 1
    ts = [threading.Thread(target=worker) for _ in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(json.dumps({'rps': count[0] / n}))
`

// egressPath is one way to the server: its fresh-connection latency (median ms), requests per
// second, and per-request latency on one kept-alive connection (median ms).
type egressPath struct {
	latency, rps, keepalive float64
}

type egressFigures struct {
	direct, intercepted, passthrough egressPath
	n                                int
}

// egressBench measures an allowed HTTPS request through the gateway from a sandbox (intercepted,
// the default, and with the name under passthrough: spliced end to end) against the same
// request from the host, in a fake internet, with the same client in the same run.
func egressBench(ctx context.Context, bin string, n int, out io.Writer) (f egressFigures, err error) {
	f.n = n
	in, err := spacedtest.NewInternet()
	if err != nil {
		return f, err
	}
	defer in.Close()
	dir, err := os.MkdirTemp("", "space-bench-egress-")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	caFile, script := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.py")
	if err := os.WriteFile(caFile, in.CAPEM, 0o644); err != nil {
		return f, err
	}
	if err := os.WriteFile(script, []byte(httpsClient), 0o644); err != nil {
		return f, err
	}
	tdir := os.Getenv("SPACE_TEMPLATES_DIR")
	if tdir == "" {
		tdir = "/var/cache/space-test/templates"
	}
	d, err := spacedtest.Start(ctx, spacedtest.Options{Bin: bin, Netns: spacedtest.NSPath(in.HostNS), Env: []string{
		"SPACE_TEMPLATES_DIR=" + tdir, "SPACE_WARM_POOL=0", "SPACE_EGRESS_DNS=" + spacedtest.InetDNS + ":53", "SPACE_EGRESS_CA=" + caFile}})
	if err != nil {
		return f, err
	}
	defer func() {
		if list, lerr := d.Client.ListSandboxes(ctx, client.ListSandboxesOptions{}); lerr == nil {
			for _, sb := range list {
				d.Client.DeleteSandbox(ctx, sb.ID)
			}
		}
		d.Stop()
	}()
	modes := []struct{ mode, arg string }{{"latency", fmt.Sprint(n)}, {"rps", "5"}, {"keepalive", fmt.Sprint(10 * n)}}
	measure := func(p *egressPath, run func(mode, arg string) (string, error)) error {
		for _, m := range modes {
			s, err := run(m.mode, m.arg)
			if err != nil {
				return fmt.Errorf("%s client: %v: %s", m.mode, err, s)
			}
			var v map[string]float64
			if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &v); err != nil {
				return fmt.Errorf("client output %q: %w", s, err)
			}
			switch m.mode {
			case "latency":
				p.latency = v["median_ms"]
			case "rps":
				p.rps = v["rps"]
			case "keepalive":
				p.keepalive = v["median_ms"]
			}
		}
		return nil
	}
	fmt.Fprintln(out, "measuring egress: HTTPS from the host (same client) …")
	if err := measure(&f.direct, func(mode, arg string) (string, error) {
		cmd := exec.CommandContext(ctx, "nsenter", "--net="+spacedtest.NSPath(in.HostNS), "--", "python3", script, mode, arg, caFile)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}); err != nil {
		return f, err
	}
	for _, pass := range []bool{false, true} {
		fmt.Fprintf(out, "measuring egress: HTTPS from a sandbox through the gateway (passthrough=%v) …\n", pass)
		eg := &client.Egress{Default: "deny", Allow: []string{"allowed.test"}}
		ca, p := "-", &f.intercepted // the gateway's certificate, trusted through the system bundle
		if pass {
			eg.Passthrough, ca, p = []string{"allowed.test"}, "/root/ca.pem", &f.passthrough // the real server's
		}
		sb, err := d.Client.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkSpec{Egress: eg}})
		if err != nil {
			return f, err
		}
		for path, content := range map[string][]byte{"/root/client.py": []byte(httpsClient), "/root/ca.pem": in.CAPEM} {
			if _, err := d.Client.Upload(ctx, sb.ID, path, strings.NewReader(string(content)), nil); err != nil {
				return f, err
			}
		}
		if err := measure(p, func(mode, arg string) (string, error) {
			res, err := d.Client.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"python3", "/root/client.py", mode, arg, ca}})
			if err != nil {
				return "", err
			}
			if res.ExitCode != 0 {
				return res.Stdout + res.Stderr, fmt.Errorf("exit %d", res.ExitCode)
			}
			return res.Stdout, nil
		}); err != nil {
			return f, err
		}
		if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
			return f, err
		}
	}
	return f, nil
}
