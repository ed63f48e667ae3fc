package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/egress/credentials"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/network/looppool"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/runtime/fake"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/secrets"
	"github.com/space-sandbox/space/internal/store/sqlite"
	"github.com/space-sandbox/space/internal/template"
	"github.com/space-sandbox/space/internal/template/build"
)

type env struct {
	t        *testing.T
	imageDir string
	url      string
	key      string
	keys     *auth.Keys
	st       *sqlite.Store
	mgr      *sandbox.Manager
	tpl      *build.Builder
	vault    *credentials.Vault
	drv      *fake.Driver
	pool     *looppool.Pool
	newMgr   func() *sandbox.Manager
}

// services are the API's dependencies beside the sandbox manager that a test may give it.
type services struct {
	templates *template.Store
	secrets   *secrets.Box
}

func newEnv(t *testing.T, tweak ...func(*sandbox.Config)) *env {
	t.Helper()
	return newEnvWith(t, services{}, tweak...)
}

func newEnvWith(t *testing.T, svc services, tweak ...func(*sandbox.Config)) *env {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := sqlite.Open(ctx, filepath.Join(dir, "space.db"), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	keys := auth.New(st)
	if _, err := keys.EnsureAdmin(ctx, dir, ""); err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, key: strings.TrimSpace(string(key)), keys: keys, st: st, drv: fake.New(t.TempDir()), pool: looppool.New(), imageDir: t.TempDir()}
	vault := credentials.New(credentials.Config{Store: st, Box: svc.secrets, Logger: log})
	e.vault = vault
	e.newMgr = func() *sandbox.Manager {
		cfg := sandbox.Config{Credentials: vault,
			Store: st, Drivers: map[string]runtime.Driver{"fake": e.drv}, DefaultRuntime: "fake",
			Slots: e.pool, Logger: log, ReapInterval: 20 * time.Millisecond, ReadyTimeout: 5 * time.Second,
			Templates: func(_ context.Context, name string) (sandbox.Template, error) {
				switch name {
				case "minimal":
					return sandbox.Template{RootFS: dir}, nil
				case "with-defaults": // as an image's config would set them
					return sandbox.Template{RootFS: dir, Env: map[string]string{"FROM_IMAGE": "yes", "GREETING": "image"},
						WorkingDir: e.imageDir, User: ""}, nil
				}
				return sandbox.Template{}, errdefs.NotFound("template " + name + " not found")
			},
		}
		for _, f := range tweak {
			f(&cfg)
		}
		m, err := sandbox.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	e.mgr = e.newMgr()
	if err := e.mgr.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	e.mgr.Start()
	e.tpl = build.New(build.Config{Lifecycle: e.mgr, Store: svc.templates, Logger: log})
	srv := httptest.NewServer(api.New(api.Config{Sandboxes: e.mgr, Templates: e.tpl, Secrets: vault, Keys: keys, Logger: log, Version: "test"}))
	t.Cleanup(func() {
		srv.Close()
		e.mgr.Close()
		for _, id := range mustList(e.drv) {
			e.drv.Delete(ctx, id)
		}
	})
	e.url = srv.URL
	return e
}

func mustList(d *fake.Driver) []string {
	ids, _ := d.List(context.Background())
	return ids
}

type resp struct {
	status int
	body   []byte
	header http.Header
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (e *env) do(method, path, body string, hdr ...string) resp {
	return e.doKey(e.key, method, path, body, hdr...)
}

func (e *env) doKey(key, method, path, body string, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{status: res.StatusCode, body: b, header: res.Header}
}

func (e *env) create(body string) string {
	e.t.Helper()
	r := e.do("POST", "/v1/sandboxes", body)
	if r.status != 201 {
		e.t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sb struct{ ID, State string }
	r.json(e.t, &sb)
	if sb.State != "running" {
		e.t.Fatalf("state %q", sb.State)
	}
	return sb.ID
}

type execResult struct {
	PID       int    `json:"pid"`
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
}

func (e *env) exec(id, body string) execResult {
	e.t.Helper()
	r := e.do("POST", "/v1/sandboxes/"+id+"/exec", body)
	if r.status != 200 {
		e.t.Fatalf("exec: %d %s", r.status, r.body)
	}
	var x execResult
	r.json(e.t, &x)
	return x
}

func wantError(t *testing.T, r resp, status int, code string) {
	t.Helper()
	var body struct {
		Error struct{ Code, Message string }
	}
	if r.status != status {
		t.Fatalf("status %d, want %d (%s)", r.status, status, r.body)
	}
	if err := json.Unmarshal(r.body, &body); err != nil || body.Error.Code != code || body.Error.Message == "" {
		t.Fatalf("error body %s, want code %q", r.body, code)
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t)
	wantError(t, e.doKey("", "GET", "/v1/sandboxes", ""), 401, "unauthenticated")
	wantError(t, e.doKey("e2b_0000", "GET", "/v1/sandboxes", ""), 401, "unauthenticated")
	if r := e.doKey("", "GET", "/healthz", ""); r.status != 200 {
		t.Fatalf("healthz %d", r.status)
	}
	// X-API-Key works too.
	if r := e.doKey("", "GET", "/v1/sandboxes", "", "X-API-Key", e.key); r.status != 200 {
		t.Fatalf("X-API-Key: %d %s", r.status, r.body)
	}
}

func TestLifecycleAndExec(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"metadata":{"team":"a"},"env":{"GREETING":"hello"},"timeout_seconds":600}`)

	var got struct {
		ID        string
		State     string
		Template  string
		Metadata  map[string]string
		Resources struct {
			VCPUs     int   `json:"vcpus"`
			MemoryMiB int64 `json:"memory_mib"`
		}
		CreatedAt time.Time `json:"created_at"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	e.do("GET", "/v1/sandboxes/"+id, "").json(t, &got)
	if got.ID != id || got.Template != "minimal" || got.Metadata["team"] != "a" || got.Resources.VCPUs != 1 || got.Resources.MemoryMiB != 512 {
		t.Fatalf("get: %+v", got)
	}
	if d := got.ExpiresAt.Sub(got.CreatedAt); d != 600*time.Second {
		t.Fatalf("expires after %s", d)
	}

	tests := []struct {
		name, body         string
		exit               int
		stdout, stderrPart string
	}{
		{"argv", `{"cmd":["echo","hi"]}`, 0, "hi\n", ""},
		{"shell", `{"command":"echo hi | tr a-z A-Z; exit 3"}`, 3, "HI\n", ""},
		{"sandbox env", `{"command":"echo $GREETING $EXTRA","env":{"EXTRA":"x"}}`, 0, "hello x\n", ""},
		{"cwd", `{"command":"pwd","cwd":"/tmp"}`, 0, "/tmp\n", ""},
		{"stdin", `{"cmd":["cat"],"stdin":"from stdin"}`, 0, "from stdin", ""},
		{"stderr", `{"command":"echo oops >&2"}`, 0, "", "oops"},
		{"timeout", `{"command":"sleep 5","timeout_seconds":0.3}`, 124, "", ""},
		{"signal death", `{"command":"kill -9 $$"}`, 137, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := e.exec(id, tt.body)
			if x.ExitCode != tt.exit || x.Stdout != tt.stdout || !strings.Contains(x.Stderr, tt.stderrPart) || x.PID == 0 {
				t.Fatalf("got %+v", x)
			}
		})
	}

	var list struct{ Sandboxes []struct{ ID string } }
	e.do("GET", "/v1/sandboxes?state=running&metadata.team=a", "").json(t, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != id {
		t.Fatalf("list: %+v", list)
	}
	e.do("GET", "/v1/sandboxes?metadata.team=b", "").json(t, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("filtered list: %+v", list)
	}

	if r := e.do("DELETE", "/v1/sandboxes/"+id, ""); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	wantError(t, e.do("GET", "/v1/sandboxes/"+id, ""), 404, "not_found")
	wantError(t, e.do("DELETE", "/v1/sandboxes/"+id, ""), 404, "not_found")
	if len(e.pool.InUse()) != 0 || len(mustList(e.drv)) != 0 {
		t.Fatalf("leaked: %d slots, runtimes %v", len(e.pool.InUse()), mustList(e.drv))
	}
}

// sseEvents reads SSE events from r and sends them on a channel.
func sseEvents(r io.Reader) <-chan [2]string {
	c := make(chan [2]string, 64)
	go func() {
		defer close(c)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				c <- [2]string{ev, strings.TrimPrefix(line, "data: ")}
			}
		}
	}()
	return c
}

func (e *env) stream(method, path, body string) (<-chan [2]string, func()) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, method, e.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(res.Body)
		e.t.Fatalf("stream %s: %d %s", path, res.StatusCode, b)
	}
	return sseEvents(res.Body), func() { cancel(); res.Body.Close() }
}

func next(t *testing.T, c <-chan [2]string) [2]string {
	t.Helper()
	select {
	case ev, ok := <-c:
		if !ok {
			t.Fatal("stream ended")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event in 10s")
	}
	return [2]string{}
}

func TestExecStreamsWhileRunning(t *testing.T) {
	e := newEnv(t)
	id := e.create("")
	gate := filepath.Join(t.TempDir(), "go")
	c, stop := e.stream("POST", "/v1/sandboxes/"+id+"/exec", `{"command":"echo first; while [ ! -e `+gate+` ]; do sleep 0.02; done; echo second"}`)
	defer stop()
	start := next(t, c)
	var pid struct{ PID uint32 }
	json.Unmarshal([]byte(start[1]), &pid)
	if start[0] != "start" || pid.PID == 0 {
		t.Fatalf("first event %v", start)
	}
	if ev := next(t, c); ev[0] != "stdout" || ev[1] != `{"data":"first\n"}` {
		t.Fatalf("event %v", ev)
	}
	// The command is still running (waiting for the gate file) while we hold its first line.
	var procs struct {
		Processes []struct {
			PID     uint32
			Running bool
		}
	}
	e.do("GET", "/v1/sandboxes/"+id+"/processes", "").json(t, &procs)
	running := false
	for _, p := range procs.Processes {
		running = running || (p.PID == pid.PID && p.Running)
	}
	if !running {
		t.Fatalf("process %d not running: %+v", pid.PID, procs)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, c); ev[0] != "stdout" || ev[1] != `{"data":"second\n"}` {
		t.Fatalf("event %v", ev)
	}
	if ev := next(t, c); ev[0] != "exit" || !strings.Contains(ev[1], `"exit_code":0`) {
		t.Fatalf("event %v", ev)
	}
}

func TestBackgroundProcess(t *testing.T) {
	e := newEnv(t)
	id := e.create("")
	r := e.do("POST", "/v1/sandboxes/"+id+"/exec", `{"command":"echo started; sleep 30","background":true}`)
	if r.status != 202 {
		t.Fatalf("background: %d %s", r.status, r.body)
	}
	var bg struct{ PID uint32 }
	r.json(t, &bg)
	c, stop := e.stream("GET", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/events", id, bg.PID), "")
	defer stop()
	next(t, c) // start
	if ev := next(t, c); ev[0] != "stdout" || ev[1] != `{"data":"started\n"}` {
		t.Fatalf("late reader got %v", ev)
	}
	wantError(t, e.do("POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", id, bg.PID), `{"signal":"SIGNOPE"}`), 400, "invalid_argument")
	if r := e.do("POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", id, bg.PID), `{"signal":"SIGTERM"}`); r.status != 204 {
		t.Fatalf("signal: %d %s", r.status, r.body)
	}
	if ev := next(t, c); ev[0] != "exit" || !strings.Contains(ev[1], `"exit_code":143`) {
		t.Fatalf("after SIGTERM: %v", ev)
	}
	wantError(t, e.do("POST", "/v1/sandboxes/"+id+"/processes/99999/signal", `{"signal":"SIGTERM"}`), 404, "not_found")
}

func TestFiles(t *testing.T) {
	e := newEnv(t)
	id := e.create("")
	dir := t.TempDir()                                      // the fake sandbox shares the host filesystem
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	r := e.do("PUT", "/v1/sandboxes/"+id+"/files?path="+dir+"/a/b/data.bin&mode=0600", string(data))
	if r.status != 201 {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	var up struct {
		Path string
		Size int64
	}
	r.json(t, &up)
	if up.Path != dir+"/a/b/data.bin" || up.Size != int64(len(data)) {
		t.Fatalf("upload result %+v", up)
	}
	if fi, err := os.Stat(dir + "/a/b/data.bin"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stat: %v %v", fi, err)
	}
	if r := e.do("GET", "/v1/sandboxes/"+id+"/files?path="+dir+"/a/b/data.bin", ""); r.status != 200 || !bytes.Equal(r.body, data) {
		t.Fatalf("download: %d, %d bytes", r.status, len(r.body))
	}
	wantError(t, e.do("GET", "/v1/sandboxes/"+id+"/files?path="+dir+"/missing", ""), 404, "not_found")
	wantError(t, e.do("GET", "/v1/sandboxes/"+id+"/files?path="+dir+"/a", ""), 400, "invalid_argument")

	if r := e.do("POST", "/v1/sandboxes/"+id+"/fs/mkdir", `{"path":"`+dir+`/new/dir"}`); r.status != 201 {
		t.Fatalf("mkdir: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/v1/sandboxes/"+id+"/fs/move", `{"from":"`+dir+`/a/b/data.bin","to":"`+dir+`/new/moved.bin"}`); r.status != 200 {
		t.Fatalf("move: %d %s", r.status, r.body)
	}
	var ls struct {
		Entries []struct {
			Name, Path, Type string
			Size             int64
			Mode             uint32
		}
	}
	e.do("GET", "/v1/sandboxes/"+id+"/fs?path="+dir+"/new", "").json(t, &ls)
	names := map[string]string{}
	for _, en := range ls.Entries {
		names[en.Name] = en.Type
		if en.Name == "moved.bin" && (en.Size != int64(len(data)) || en.Mode != 0o600 || en.Path != dir+"/new/moved.bin") {
			t.Fatalf("entry %+v", en)
		}
	}
	if names["moved.bin"] != "file" || names["dir"] != "dir" || len(names) != 2 {
		t.Fatalf("list: %+v", ls)
	}
	wantError(t, e.do("DELETE", "/v1/sandboxes/"+id+"/files?path="+dir+"/new", ""), 409, "conflict")
	if r := e.do("DELETE", "/v1/sandboxes/"+id+"/files?path="+dir+"/new&recursive=true", ""); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if _, err := os.Stat(dir + "/new"); !os.IsNotExist(err) {
		t.Fatalf("still there: %v", err)
	}

	c, stop := e.stream("GET", "/v1/sandboxes/"+id+"/fs/watch?path="+dir, "")
	defer stop()
	os.WriteFile(dir+"/watched.txt", []byte("x"), 0o644)
	ev := next(t, c)
	if ev[0] != "change" || !strings.Contains(ev[1], dir+"/watched.txt") {
		t.Fatalf("watch event %v", ev)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	e := newEnv(t)
	id := e.create("")
	untouched := filepath.Join(t.TempDir(), "x") // a rejected upload must not create it
	big := `{"metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`
	deep := `{"metadata":` + strings.Repeat("[", 33) + strings.Repeat("]", 33) + `}`
	var vars []string
	for i := range 20 {
		vars = append(vars, fmt.Sprintf(`"V%d":"%s"`, i, strings.Repeat("v", 4000)))
	}
	bigEnv := `{"env":{` + strings.Join(vars, ",") + `}}`
	bigExecEnv := `{"cmd":["true"],"env":{` + strings.Join(vars, ",") + `}}`
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown field", "POST", "/v1/sandboxes", `{"templat":"minimal"}`, 400, "invalid_argument"},
		{"wrong type", "POST", "/v1/sandboxes", `{"timeout_seconds":"soon"}`, 400, "invalid_argument"},
		{"trailing data", "POST", "/v1/sandboxes", `{} {}`, 400, "invalid_argument"},
		{"not json", "POST", "/v1/sandboxes", `template=minimal`, 400, "invalid_argument"},
		{"oversized", "POST", "/v1/sandboxes", big, 413, "too_large"},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nope"}`, 404, "not_found"},
		{"bad template name", "POST", "/v1/sandboxes", `{"template":"../etc"}`, 400, "invalid_argument"},
		{"bad runtime", "POST", "/v1/sandboxes", `{"runtime":"vmware"}`, 400, "invalid_argument"},
		{"negative timeout", "POST", "/v1/sandboxes", `{"timeout_seconds":-1}`, 400, "invalid_argument"},
		{"overflowing timeout", "POST", "/v1/sandboxes", `{"timeout_seconds":9223372037}`, 400, "invalid_argument"},
		{"overflowing timeout update", "POST", "/v1/sandboxes/" + id + "/timeout", `{"timeout_seconds":18446744074}`, 400, "invalid_argument"},
		{"bad env key", "POST", "/v1/sandboxes", `{"env":{"A=B":"c"}}`, 400, "invalid_argument"},
		{"pause without a checkpointing runtime", "POST", "/v1/sandboxes", `{"on_timeout":"pause"}`, 400, "invalid_argument"},
		{"bad on_timeout", "POST", "/v1/sandboxes", `{"on_timeout":"explode"}`, 400, "invalid_argument"},
		{"bad egress", "POST", "/v1/sandboxes", `{"network":{"egress":{"default":"maybe"}}}`, 400, "invalid_argument"},
		{"bad memory", "POST", "/v1/sandboxes", `{"resources":{"memory_mib":1}}`, 400, "invalid_argument"},
		{"too few pids", "POST", "/v1/sandboxes", `{"resources":{"pids":4}}`, 400, "invalid_argument"},
		{"too many pids", "POST", "/v1/sandboxes", `{"resources":{"pids":1000000}}`, 400, "invalid_argument"},
		{"malformed id", "GET", "/v1/sandboxes/not-an-id", "", 404, "not_found"}, // IDs are opaque: TestMalformedIDsAre404
		{"malformed from_snapshot", "POST", "/v1/sandboxes", `{"from_snapshot":"not-an-id"}`, 404, "not_found"},
		{"malformed restore snapshot_id", "POST", "/v1/sandboxes/" + id + "/restore", `{"snapshot_id":"not-an-id"}`, 404, "not_found"},
		{"malformed diff against", "GET", "/v1/snapshots/snp_aaaaaaaaaaaaaaaaaaaa/diff?against=x%00y", "", 404, "not_found"},
		{"unknown id", "GET", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa", "", 404, "not_found"},
		{"bad state filter", "GET", "/v1/sandboxes?state=sleepy", "", 400, "invalid_argument"},
		{"unknown query", "GET", "/v1/sandboxes?colour=red", "", 400, "invalid_argument"},
		{"exec both", "POST", "/v1/sandboxes/" + id + "/exec", `{"cmd":["ls"],"command":"ls"}`, 400, "invalid_argument"},
		{"exec none", "POST", "/v1/sandboxes/" + id + "/exec", `{}`, 400, "invalid_argument"},
		{"exec relative cwd", "POST", "/v1/sandboxes/" + id + "/exec", `{"cmd":["ls"],"cwd":"tmp"}`, 400, "invalid_argument"},
		{"relative path", "GET", "/v1/sandboxes/" + id + "/files?path=etc/passwd", "", 400, "invalid_argument"},
		{"no path", "GET", "/v1/sandboxes/" + id + "/files", "", 400, "invalid_argument"},
		{"non-UTF-8 path", "GET", "/v1/sandboxes/" + id + "/files?path=/tmp/a%FFb", "", 400, "invalid_argument"},
		{"non-UTF-8 upload path", "PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/%C3", "x", 400, "invalid_argument"},
		{"non-UTF-8 list path", "GET", "/v1/sandboxes/" + id + "/fs?path=/%FE", "", 400, "invalid_argument"},
		{"non-UTF-8 remove path", "DELETE", "/v1/sandboxes/" + id + "/files?path=/tmp/%80", "", 400, "invalid_argument"},
		{"non-UTF-8 watch path", "GET", "/v1/sandboxes/" + id + "/fs/watch?path=/tmp/%FF", "", 400, "invalid_argument"},
		{"path too long", "GET", "/v1/sandboxes/" + id + "/files?path=/" + strings.Repeat("x", 4096), "", 400, "invalid_argument"},
		{"nul path", "GET", "/v1/sandboxes/" + id + "/files?path=/tmp/a%00b", "", 400, "invalid_argument"},
		{"remove root", "DELETE", "/v1/sandboxes/" + id + "/files?path=/&recursive=true", "", 400, "invalid_argument"},
		{"bad mode", "PUT", "/v1/sandboxes/" + id + "/files?path=" + untouched + "&mode=999", "x", 400, "invalid_argument"},
		{"bad pid", "POST", "/v1/sandboxes/" + id + "/processes/abc/signal", `{"signal":"TERM"}`, 400, "invalid_argument"},
		{"no route", "GET", "/v1/nothing", "", 404, "not_found"},
		{"timeout missing", "POST", "/v1/sandboxes/" + id + "/timeout", `{}`, 400, "invalid_argument"},
		{"too deep", "POST", "/v1/sandboxes", deep, 400, "invalid_argument"},
		{"env over 64 KiB", "POST", "/v1/sandboxes", bigEnv, 400, "invalid_argument"},
		{"exec env over 64 KiB", "POST", "/v1/sandboxes/" + id + "/exec", bigExecEnv, 400, "invalid_argument"},
		{"exec too deep", "POST", "/v1/sandboxes/" + id + "/exec", `{"cmd":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, 400, "invalid_argument"},
		{"upload to a non-UTF-8 path", "PUT", "/v1/sandboxes/" + id + "/files?path=" + url.QueryEscape(untouched+"\xff"), "data", 400, "invalid_argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, e.do(tt.method, tt.path, tt.body), tt.status, tt.code)
		})
	}
	var list struct{ Sandboxes []struct{ ID string } }
	e.do("GET", "/v1/sandboxes", "").json(t, &list)
	if len(list.Sandboxes) != 1 || len(e.pool.InUse()) != 1 {
		t.Fatalf("bad input changed state: %+v, %d slots", list, len(e.pool.InUse()))
	}
	if _, err := os.Stat(untouched); !os.IsNotExist(err) {
		t.Fatalf("a rejected upload touched the sandbox: %v", err)
	}
}

func TestTenants(t *testing.T) {
	e := newEnv(t)
	id := e.create("")
	r := e.do("POST", "/v1/keys", `{"tenant":"other"}`)
	if r.status != 201 {
		t.Fatalf("create key: %d %s", r.status, r.body)
	}
	var k struct{ Key, Tenant string }
	r.json(t, &k)
	wantError(t, e.doKey(k.Key, "GET", "/v1/sandboxes/"+id, ""), 404, "not_found")
	wantError(t, e.doKey(k.Key, "DELETE", "/v1/sandboxes/"+id, ""), 404, "not_found")
	wantError(t, e.doKey(k.Key, "POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["true"]}`), 404, "not_found")
	wantError(t, e.doKey(k.Key, "POST", "/v1/keys", `{"tenant":"x"}`), 403, "permission_denied")
	var list struct{ Sandboxes []struct{ ID string } }
	e.doKey(k.Key, "GET", "/v1/sandboxes", "").json(t, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("other tenant sees %+v", list)
	}
	if r := e.do("GET", "/v1/sandboxes/"+id, ""); r.status != 200 {
		t.Fatalf("owner: %d", r.status)
	}
}

func TestEventsExpiryAndCrash(t *testing.T) {
	e := newEnv(t, func(c *sandbox.Config) { c.HealthInterval = 50 * time.Millisecond })
	c, stop := e.stream("GET", "/v1/events", "")
	defer stop()
	id := e.create(`{"timeout_seconds":1}`)
	for _, want := range []string{"sandbox.created", "sandbox.expired"} {
		ev := next(t, c)
		if ev[0] != want || !strings.Contains(ev[1], id) {
			t.Fatalf("event %v, want %s", ev, want)
		}
	}
	wantError(t, e.do("GET", "/v1/sandboxes/"+id, ""), 404, "not_found")

	id2 := e.create("")
	next(t, c) // created
	e.drv.Kill(id2)
	if ev := next(t, c); ev[0] != "sandbox.crashed" {
		t.Fatalf("event %v", ev)
	}
	var sb struct{ State, Error string }
	e.do("GET", "/v1/sandboxes/"+id2, "").json(t, &sb)
	if sb.State != "error" || sb.Error == "" {
		t.Fatalf("crashed sandbox: %+v", sb)
	}
	wantError(t, e.do("POST", "/v1/sandboxes/"+id2+"/exec", `{"cmd":["true"]}`), 409, "conflict")
	if r := e.do("DELETE", "/v1/sandboxes/"+id2, ""); r.status != 204 {
		t.Fatalf("delete crashed: %d %s", r.status, r.body)
	}
	if len(e.pool.InUse()) != 0 {
		t.Fatalf("%d slots leaked", len(e.pool.InUse()))
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	e := newEnv(t)
	e.drv.FailCreate = func(string) bool { return true }
	r := e.do("POST", "/v1/sandboxes", "")
	if r.status != 500 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	var list struct{ Sandboxes []struct{ ID string } }
	e.do("GET", "/v1/sandboxes", "").json(t, &list)
	if len(list.Sandboxes) != 0 || len(e.pool.InUse()) != 0 || len(mustList(e.drv)) != 0 {
		t.Fatalf("left behind: %+v, %d slots", list, len(e.pool.InUse()))
	}
}

func TestRecoverReadoptsRunning(t *testing.T) {
	e := newEnv(t)
	id := e.create("")
	bg := e.do("POST", "/v1/sandboxes/"+id+"/exec", `{"command":"sleep 30","background":true}`)
	var p struct{ PID uint32 }
	bg.json(t, &p)
	// A second manager over the same store and runtime, as after a restart of spaced.
	e.mgr.Close()
	m2 := e.newMgr()
	if err := m2.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	procs, err := m2.Processes(context.Background(), auth.AdminTenant, id)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, pi := range procs {
		found = found || (pi.PID == p.PID && pi.Running)
	}
	if !found {
		t.Fatalf("background process %d not found after recover: %+v", p.PID, procs)
	}
	_ = m2.Signal(context.Background(), auth.AdminTenant, id, p.PID, 9)
	if err := m2.Delete(context.Background(), auth.AdminTenant, id); err != nil {
		t.Fatal(err)
	}
}

func TestWarmPool(t *testing.T) {
	e := newEnv(t, func(c *sandbox.Config) { c.WarmPool = 1 })
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the pool to fill", func() bool { return e.mgr.WarmReady() == 1 })
	warm := mustList(e.drv)[0]
	var list struct{ Sandboxes []struct{ ID string } }
	e.do("GET", "/v1/sandboxes", "").json(t, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("pool member visible to a tenant: %+v", list)
	}

	id := e.create(`{"env":{"GREETING":"from the request"},"metadata":{"m":"1"}}`)
	if id != warm {
		t.Fatalf("create did not take the warm sandbox %s (got %s)", warm, id)
	}
	if x := e.exec(id, `{"command":"echo $GREETING"}`); x.Stdout != "from the request\n" {
		t.Fatalf("env of a claimed sandbox: %+v", x)
	}
	var sb struct {
		Metadata  map[string]string
		ExpiresAt time.Time `json:"expires_at"`
	}
	e.do("GET", "/v1/sandboxes/"+id, "").json(t, &sb)
	if sb.Metadata["m"] != "1" || time.Until(sb.ExpiresAt) < 200*time.Second {
		t.Fatalf("claimed record: %+v", sb)
	}
	// A request of another shape goes cold.
	big := e.create(`{"resources":{"memory_mib":1024}}`)
	if big == warm {
		t.Fatal("a non-default shape was served from the pool")
	}
	waitFor("the pool to refill", func() bool { return e.mgr.WarmReady() == 1 && len(mustList(e.drv)) == 3 })

	// Close removes the pool member and only it.
	e.mgr.Close()
	if got := mustList(e.drv); len(got) != 2 {
		t.Fatalf("after Close, runtimes %v; want the two claimed sandboxes", got)
	}

	// A pool member left by a crashed run is removed by Recover.
	m2 := e.newMgr()
	m2.Start()
	waitFor("the new pool to fill", func() bool { return m2.WarmReady() == 1 && len(mustList(e.drv)) == 3 })
	// Simulate a crash: no Close; a third manager recovers.
	m3 := e.newMgr()
	if err := m3.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := mustList(e.drv); len(got) != 2 {
		t.Fatalf("after recovery, runtimes %v; want the two claimed sandboxes", got)
	}
	m2.Close() // its pool member is already gone; Close must cope
}

// A sandbox that crashed gives up its slot for good: after a restart, recovery must not take the
// slot back from the sandbox that holds it now.
func TestCrashedSandboxDoesNotReclaimItsSlot(t *testing.T) {
	e := newEnv(t, func(c *sandbox.Config) { c.HealthInterval = 30 * time.Millisecond })
	crashed := e.create("")
	e.drv.Kill(crashed)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var sb struct{ State string }
		e.do("GET", "/v1/sandboxes/"+crashed, "").json(t, &sb)
		if sb.State == "error" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("crash not noticed")
		}
	}
	healthy := e.create("") // takes the freed slot
	e.mgr.Close()
	m2 := e.newMgr()
	if err := m2.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := m2.Get(context.Background(), auth.AdminTenant, healthy)
	if err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("healthy sandbox after recovery: %+v %v", got, err)
	}
	if _, err := m2.Processes(context.Background(), auth.AdminTenant, healthy); err != nil {
		t.Fatalf("healthy sandbox unreachable after recovery: %v", err)
	}
	if err := m2.Delete(context.Background(), auth.AdminTenant, crashed); err != nil {
		t.Fatal(err)
	}
	if len(e.pool.InUse()) != 1 {
		t.Fatalf("deleting the crashed sandbox changed the slots: %d in use", len(e.pool.InUse()))
	}
	if err := m2.Delete(context.Background(), auth.AdminTenant, healthy); err != nil {
		t.Fatal(err)
	}
}

// A sandbox being created is visible as "creating" at once; reads do not wait for the create.
func TestStateVisibleDuringCreate(t *testing.T) {
	e := newEnv(t)
	e.drv.Delay = 2 * time.Second
	done := make(chan resp, 1)
	go func() { done <- e.do("POST", "/v1/sandboxes", "") }()
	var id string
	for deadline := time.Now().Add(time.Second); id == ""; time.Sleep(10 * time.Millisecond) {
		var list struct{ Sandboxes []struct{ ID, State string } }
		e.do("GET", "/v1/sandboxes", "").json(t, &list)
		if len(list.Sandboxes) == 1 && list.Sandboxes[0].State == "creating" {
			id = list.Sandboxes[0].ID
		}
		if time.Now().After(deadline) {
			t.Fatal("creating sandbox not listed")
		}
	}
	t0 := time.Now()
	var sb struct{ State string }
	e.do("GET", "/v1/sandboxes/"+id, "").json(t, &sb)
	if sb.State != "creating" || time.Since(t0) > time.Second {
		t.Fatalf("GET during create: %q after %s", sb.State, time.Since(t0))
	}
	if !strings.Contains(string(e.do("GET", "/metrics", "").body), `space_sandboxes{state="creating"} 1`) {
		t.Fatal("metrics do not show the sandbox being created")
	}
	if r := <-done; r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
}

// A template's image defaults (env, working directory) apply to every command; the sandbox's own
// env and the command's own settings win over them.
func TestTemplateDefaults(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"template":"with-defaults","env":{"GREETING":"sandbox"}}`)
	if x := e.exec(id, `{"command":"echo $FROM_IMAGE $GREETING; pwd"}`); x.Stdout != "yes sandbox\n"+e.imageDir+"\n" {
		t.Fatalf("defaults: %+v", x)
	}
	if x := e.exec(id, `{"command":"pwd","cwd":"/"}`); x.Stdout != "/\n" {
		t.Fatalf("explicit cwd: %+v", x)
	}
}
