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
if mode == 'latency':
    for _ in range(3): one()
    ts = sorted(one() for _ in range(n))
    print(json.dumps({'median_ms': ts[len(ts) // 2] * 1000}))
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

type egressFigures struct {
	direct, through, inspected     float64 // median ms
	directRPS, throughRPS, inspRPS float64
}

// egressBench measures an allowed HTTPS request through the gateway (from a sandbox, without
// and with interception) against the same request from the host, in a fake internet.
func egressBench(ctx context.Context, bin string, n int, out io.Writer) (f egressFigures, err error) {
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
	parse := func(s, key string) (float64, error) {
		var m map[string]float64
		if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &m); err != nil {
			return 0, fmt.Errorf("client output %q: %w", s, err)
		}
		return m[key], nil
	}
	host := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + spacedtest.NSPath(in.HostNS), "--", "python3", script}, args...)...)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	fmt.Fprintln(out, "measuring egress: HTTPS from the host (same client) …")
	s, err := host("latency", fmt.Sprint(n), caFile)
	if err != nil {
		return f, fmt.Errorf("host client: %v: %s", err, s)
	}
	if f.direct, err = parse(s, "median_ms"); err != nil {
		return f, err
	}
	if s, err = host("rps", "5", caFile); err != nil {
		return f, fmt.Errorf("host client: %v: %s", err, s)
	}
	if f.directRPS, err = parse(s, "rps"); err != nil {
		return f, err
	}
	for _, inspect := range []bool{false, true} {
		fmt.Fprintf(out, "measuring egress: HTTPS from a sandbox through the gateway (inspect=%v) …\n", inspect)
		sb, err := d.Client.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkSpec{
			Egress: &client.Egress{Default: "deny", Allow: []string{"allowed.test"}, Inspect: inspect}}})
		if err != nil {
			return f, err
		}
		for path, content := range map[string][]byte{"/root/client.py": []byte(httpsClient), "/root/ca.pem": in.CAPEM} {
			if _, err := d.Client.Upload(ctx, sb.ID, path, strings.NewReader(string(content)), nil); err != nil {
				return f, err
			}
		}
		ca := "/root/ca.pem"
		if inspect {
			ca = "-" // the gateway's certificate, trusted through the system bundle
		}
		var lat, rps float64
		for _, mode := range []string{"latency", "rps"} {
			arg := fmt.Sprint(n)
			if mode == "rps" {
				arg = "5"
			}
			res, err := d.Client.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"python3", "/root/client.py", mode, arg, ca}})
			if err != nil || res.ExitCode != 0 {
				return f, fmt.Errorf("sandbox client: %v %+v", err, res)
			}
			key := map[string]string{"latency": "median_ms", "rps": "rps"}[mode]
			v, err := parse(res.Stdout, key)
			if err != nil {
				return f, err
			}
			if mode == "latency" {
				lat = v
			} else {
				rps = v
			}
		}
		if inspect {
			f.inspected, f.inspRPS = lat, rps
		} else {
			f.through, f.throughRPS = lat, rps
		}
		if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
			return f, err
		}
	}
	return f, nil
}
