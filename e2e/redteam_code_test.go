package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// rtHostileServer replaces a code-interpreter sandbox's server with one that answers every run
// as /tmp/rt-mode says: what a sandbox's code can do, since the server is the sandbox's own.
const rtHostileServer = `import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers(); self.wfile.write(b'OK')
    def do_POST(self):
        self.rfile.read(int(self.headers.get('Content-Length', 0)))
        mode = open('/tmp/rt-mode').read().strip()
        self.send_response(200); self.send_header('Connection', 'close'); self.end_headers()
        w = self.wfile.write
        try:
            if mode == 'bigline':
                w(b'{"type":"stdout","text":"')
                for _ in range(100): w(b'x' * (1 << 20))
                w(b'"}\n')
            elif mode == 'endless':
                line = b'{"type":"stdout","text":"' + b'y' * 4000 + b'"}\n'
                while True: w(line)
            elif mode == 'bigresults':
                line = b'{"type":"result","json":{"k":"' + b'z' * (8 << 20) + b'"}}\n'
                while True: w(line)
            elif mode == 'garbage':
                w(b'this is not json\n')
            elif mode == 'deep':
                w(b'{"type":"result","json":' + b'[' * 100000 + b']' * 100000 + b'}\n')
        except (BrokenPipeError, ConnectionResetError):
            pass
http.server.ThreadingHTTPServer(('0.0.0.0', 49999), H).serve_forever()
`

// codeGroup: attacks on and through the code interpreter. Its server's answers are the
// sandbox's to forge: lines that never end, output without end, JSON nested past any parser,
// garbage. spaced must answer each with an error in bounded time and memory and stay well.
// Running code through E2B's route needs the sandbox's access token; context IDs cannot walk
// the server's paths.
func (rt *redTeam) codeGroup(t *testing.T) {
	d := rt.rtDaemon(t)
	c := d.Client
	post := func(path, body string, hdr ...string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", d.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		if len(hdr) == 0 {
			req.Header.Set("Authorization", "Bearer "+d.Opts.Key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		return res.StatusCode, string(b)
	}

	// Made through E2B's route, which hands out the access token.
	status, body := post("/sandboxes", `{"templateID":"code-interpreter-v1","timeout":600}`, "X-API-Key", d.Opts.Key)
	var sb struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(body), &sb); err != nil || status != 201 {
		t.Fatalf("e2b create: %d %s", status, body)
	}
	id := sb.SandboxID

	// E2B's route: /execute on port 49999 without the access token (the SDK sends it there).
	{
		status, body := post("/execute", `{"code":"open('/home/user/pwned','w').write('x')"}`,
			"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "49999")
		ev := ""
		if status/100 == 2 {
			ev = fmt.Sprintf("ran code without the access token: %d %.200s", status, body)
		}
		control, cbody := post("/execute", `{"code":"1+1"}`, "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.EnvdAccessToken)
		failure := ""
		if control != 200 || !strings.Contains(cbody, `"2"`) {
			failure = fmt.Sprintf("control with the token: %d %.200s", control, cbody)
		}
		rt.judge(t, "code", "e2b-execute-without-access-token", ev, failure, fmt.Sprint(status))
	}
	// Context IDs that would walk the server's paths.
	for _, ctxID := range []string{"..%2F..%2Fhealth", "%2E%2E", "a%2Fb", "x%3Fy=1"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "DELETE", d.URL+"/v1/sandboxes/"+id+"/code/contexts/"+ctxID, nil)
		req.Header.Set("Authorization", "Bearer "+d.Opts.Key)
		res, err := http.DefaultClient.Do(req)
		cancel()
		ev := ""
		if err == nil {
			res.Body.Close()
			if res.StatusCode/100 == 2 {
				ev = fmt.Sprintf("DELETE context %s answered %d", ctxID, res.StatusCode)
			}
		}
		rt.judge(t, "code", "context-id-path-walk/"+ctxID, ev, "", "")
	}

	// The hostile server.
	if _, err := sh(c, id, "pkill -u user -f /opt/space/code-interpreter/ ; sleep 1; echo endless > /tmp/rt-mode", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctxT(t), id, "/tmp/rt-server.py", strings.NewReader(rtHostileServer), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecBackground(ctxT(t), id, client.ExecRequest{Command: "python3 /tmp/rt-server.py"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	modes := []string{"endless"}
	if rt.full {
		modes = []string{"endless", "bigline", "bigresults", "garbage", "deep"}
	}
	for _, mode := range modes {
		if _, err := sh(c, id, "echo "+mode+" > /tmp/rt-mode", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		base := peakRSS(t, d.PID(), true)
		t0 := time.Now()
		status, body := post("/v1/sandboxes/"+id+"/code", `{"code":"1"}`)
		took := time.Since(t0)
		peak := peakRSS(t, d.PID(), false)
		ev := ""
		switch {
		case status/100 == 2:
			ev = fmt.Sprintf("spaced took the forged answer: %d %.200s", status, body)
		case status == 0:
			ev = "no answer: " + body
		case took > 60*time.Second:
			ev = fmt.Sprintf("answered after %s", took.Round(time.Second))
		case peak-base > 128<<10:
			ev = fmt.Sprintf("spaced's peak memory grew by %d MiB", (peak-base)>>10)
		}
		rt.judge(t, "code", "hostile-server/"+mode, ev, healthy(c, id),
			fmt.Sprintf("%d in %s, peak +%d MiB", status, took.Round(time.Millisecond), max(0, peak-base)>>10))
	}
}
