package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// TestE2BSDK drives spaced with the unmodified E2B SDK (npm "e2b", pinned at 2.51.0 and 2.50.0,
// which use different create and connect routes; e2e/e2b holds the package-lock, installed by
// `npm ci`): create, commands, files, info, list, timeout, pause, connect, kill.
func TestE2BSDK(t *testing.T) {
	dir, err := filepath.Abs("e2b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b-2.51.0")); err != nil {
		t.Fatalf("the E2B SDK is not installed: run `npm ci` in e2e/e2b (.ci/run does): %v", err)
	}
	d := startSpaced(t)
	for _, version := range []string{"2.51.0", "2.50.0"} {
		t.Run(version, func(t *testing.T) {
			cmd := exec.Command("node", "test.mjs", version)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "E2B_API_KEY="+d.Opts.Key, "E2B_API_URL="+d.URL, "E2B_SANDBOX_URL="+d.URL)
			out, err := cmd.CombinedOutput()
			t.Logf("e2b %s:\n%s", version, out)
			if err != nil || strings.Contains(string(out), "FAIL") {
				t.Fatalf("the E2B SDK %s failed against spaced: %v", version, err)
			}
		})
	}
}

// TestE2BCodeInterpreter drives spaced with the unmodified @e2b/code-interpreter SDK (npm,
// pinned in e2e/e2b's package-lock): create (from the warm pool), state across calls, streaming
// callbacks, errors, a PNG chart, a DataFrame's HTML, a CSV uploaded and totalled with pandas,
// contexts, bash and JavaScript, a timeout that leaves the kernel usable, pause + connect, kill.
func TestE2BCodeInterpreter(t *testing.T) {
	dir, err := filepath.Abs("e2b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@e2b", "code-interpreter")); err != nil {
		t.Fatalf("the E2B code-interpreter SDK is not installed: run `npm ci` in e2e/e2b (.ci/run does): %v", err)
	}
	d := startSpaced(t, "SPACE_WARM_POOL=0", "SPACE_WARM_POOL_TEMPLATES=code-interpreter=1")
	t0 := time.Now()
	waitWarm(t, d, 1)
	t.Logf("the warm pool filled in %s", time.Since(t0).Round(time.Millisecond))
	cmd := exec.Command("node", "codeinterp.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+d.Opts.Key, "E2B_API_URL="+d.URL, "E2B_SANDBOX_URL="+d.URL)
	t1 := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("@e2b/code-interpreter (%s):\n%s", time.Since(t1).Round(time.Millisecond), out)
	if err != nil || strings.Contains(string(out), "FAIL") {
		t.Fatalf("the E2B code-interpreter SDK failed against spaced: %v", err)
	}
	if !strings.Contains(d.Log(), `template=code-interpreter warm=true`) {
		t.Errorf("the SDK's sandbox did not come from the warm pool")
	}
}

// waitWarm waits until spaced's warm pools hold at least n sandboxes.
func waitWarm(t *testing.T, d *spacedtest.Daemon, n int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if res, err := http.Get(d.URL + "/metrics"); err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "space_warm_pool_ready "); ok {
					if ready, err := strconv.Atoi(v); err == nil && ready >= n {
						return
					}
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("the warm pool did not fill to %d in 3 minutes; log:\n%s", n, d.Log())
}

// TestPorts: a port a process in the sandbox listens on is reachable through the native route
// (API key) and through <port>-<id>.<domain> host names (no key; the traffic token when the
// sandbox asked for one), and envd through 49983-<id>.<domain>.
func TestPorts(t *testing.T) {
	d := startSpaced(t, "SPACE_DOMAIN=sandbox.test")
	c := d.Client
	ctx := ctxT(t)
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	run(t, c, id, "mkdir -p /www && echo served-from-the-sandbox > /www/index.html")
	if _, err := c.ExecBackground(ctx, id, client.ExecRequest{Command: "busybox httpd -f -p 8080 -h /www"}); err != nil {
		t.Fatal(err)
	}
	get := func(url, host string, hdr map[string]string) (int, string) {
		t.Helper()
		for range 50 { // the server may still be starting
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			if host != "" {
				req.Host = host
			}
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway {
				return resp.StatusCode, string(b)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s (%s): sandbox never answered", url, host)
		return 0, ""
	}
	key := map[string]string{"Authorization": "Bearer " + d.Opts.Key}
	if code, body := get(d.URL+"/v1/sandboxes/"+id+"/ports/8080/index.html", "", key); code != 200 || body != "served-from-the-sandbox\n" {
		t.Fatalf("native port route: %d %q", code, body)
	}
	if code, _ := get(d.URL+"/v1/sandboxes/"+id+"/ports/8080/index.html", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("native port route without a key: %d", code)
	}
	if code, body := get(d.URL+"/index.html", "8080-"+id+".sandbox.test", nil); code != 200 || body != "served-from-the-sandbox\n" {
		t.Fatalf("host-routed port: %d %q", code, body)
	}
	// envd by host name, with the sandbox's access token from the E2B detail route.
	code, detail := get(d.URL+"/sandboxes/"+id, "", map[string]string{"X-API-Key": d.Opts.Key})
	var info struct {
		EnvdAccessToken string `json:"envdAccessToken"`
		Domain          string `json:"domain"`
	}
	if err := json.Unmarshal([]byte(detail), &info); err != nil || code != 200 || info.Domain != "sandbox.test" {
		t.Fatalf("E2B detail: %d %s", code, detail)
	}
	if code, _ := get(d.URL+"/health", "49983-"+id+".sandbox.test", map[string]string{"X-Access-Token": info.EnvdAccessToken}); code != http.StatusNoContent {
		t.Fatalf("envd by host name: %d", code)
	}
	if code, _ := get(d.URL+"/files?path=/www/index.html", "49983-"+id+".sandbox.test", map[string]string{"X-Access-Token": "wrong"}); code != http.StatusUnauthorized {
		t.Fatalf("envd with a wrong token: %d", code)
	}

	// A sandbox created through E2B without public traffic needs its traffic token.
	req, _ := http.NewRequest(http.MethodPost, d.URL+"/sandboxes", strings.NewReader(`{"templateID":"minimal","network":{"allowPublicTraffic":false}}`))
	req.Header.Set("X-API-Key", d.Opts.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct {
		SandboxID          string `json:"sandboxID"`
		TrafficAccessToken string `json:"trafficAccessToken"`
	}
	json.NewDecoder(resp.Body).Decode(&sb)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || sb.TrafficAccessToken == "" {
		t.Fatalf("E2B create without public traffic: %d %+v", resp.StatusCode, sb)
	}
	run(t, c, sb.SandboxID, "mkdir -p /www && echo private > /www/index.html")
	if _, err := c.ExecBackground(ctx, sb.SandboxID, client.ExecRequest{Command: "busybox httpd -f -p 8080 -h /www"}); err != nil {
		t.Fatal(err)
	}
	host := "8080-" + sb.SandboxID + ".sandbox.test"
	if code, body := get(d.URL+"/index.html", host, map[string]string{"e2b-traffic-access-token": sb.TrafficAccessToken}); code != 200 || body != "private\n" {
		t.Fatalf("with the traffic token: %d %q", code, body)
	}
	if code, _ := get(d.URL+"/index.html", host, nil); code != http.StatusForbidden {
		t.Fatalf("without the traffic token: %d", code)
	}
}
