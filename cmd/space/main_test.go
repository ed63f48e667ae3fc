package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/space-sandbox/space/pkg/client"
)

const testKey = "sk_test"

// fakeSpaced is an in-memory stand-in for spaced's HTTP API, enough for the CLI.
type fakeSpaced struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	next      int
	sandboxes map[string]client.Sandbox
	order     []string
	files     map[string][]byte // "id:path" → content
	requests  []string          // "METHOD path?query"
	bodies    map[string]string // last JSON body per "METHOD path"
	resizes   []client.PTYSize
	signals   []string               // "pid SIGNAL"
	stdin     chan []byte            // stdin posted to the background process; nil at its end (?eof=true)
	passwd    string                 // what the sandbox's passwd lookup prints (space shell); "" fails it
	templates []string               // the templates listed as built
	release   chan struct{}          // when set, a create waits for it to close
	builds    []client.BuildProgress // template builds /v1/info reports
}

func newFake(t *testing.T) *fakeSpaced {
	f := &fakeSpaced{
		t: t, sandboxes: map[string]client.Sandbox{}, files: map[string][]byte{},
		bodies: map[string]string{}, stdin: make(chan []byte, 100),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("GET /v1/sandboxes", f.list)
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb client.Sandbox) {
		writeJSON(w, 200, sb)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb client.Sandbox) {
		f.mu.Lock()
		delete(f.sandboxes, sb.ID)
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", f.withSandbox(f.exec))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/events", f.withSandbox(f.processEvents))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/stdin", f.withSandbox(func(w http.ResponseWriter, r *http.Request, _ client.Sandbox) {
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			f.stdin <- b
		}
		if r.URL.Query().Get("eof") == "true" {
			f.stdin <- nil
		}
		w.WriteHeader(204)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/resize", f.withSandbox(func(w http.ResponseWriter, r *http.Request, _ client.Sandbox) {
		var sz client.PTYSize
		json.NewDecoder(r.Body).Decode(&sz)
		f.mu.Lock()
		f.resizes = append(f.resizes, sz)
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/signal", f.withSandbox(func(w http.ResponseWriter, r *http.Request, _ client.Sandbox) {
		var body struct{ Signal string }
		json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.signals = append(f.signals, r.PathValue("pid")+" "+body.Signal)
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb client.Sandbox) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			writeError(w, 400, "invalid_argument", err.Error())
			return
		}
		p := r.URL.Query().Get("path")
		f.mu.Lock()
		f.files[sb.ID+":"+p] = b
		f.mu.Unlock()
		writeJSON(w, 201, client.UploadResult{Path: p, Size: int64(len(b))})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb client.Sandbox) {
		f.mu.Lock()
		b, ok := f.files[sb.ID+":"+r.URL.Query().Get("path")]
		f.mu.Unlock()
		if !ok {
			writeError(w, 404, "not_found", "no such file: "+r.URL.Query().Get("path"))
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(b)
	}))
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		out := []client.Template{}
		for _, n := range f.templates {
			out = append(out, client.Template{Name: n, CreatedAt: t0})
		}
		f.mu.Unlock()
		writeJSON(w, 200, map[string]any{"templates": out})
	})
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, client.Info{Version: "0.1.0-test", DefaultRuntime: "gvisor", Runtimes: []client.RuntimeInfo{
			{Name: "gvisor", Available: true}, {Name: "firecracker", Reason: "no /dev/kvm"},
		}, Builds: f.builds})
	})
	mux.HandleFunc("POST /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Tenant string }
		json.NewDecoder(r.Body).Decode(&body)
		writeJSON(w, 201, client.APIKey{ID: "key_2", Key: "sk_" + body.Tenant, Tenant: body.Tenant})
	})
	mux.HandleFunc("GET /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"keys": []client.KeyInfo{
			{ID: "key_1", Tenant: "default", Admin: true, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
			{ID: "key_2", Tenant: "acme", CreatedAt: time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)},
		}})
	})
	mux.HandleFunc("DELETE /v1/keys/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "key_2" {
			writeError(w, 404, "not_found", "key "+r.PathValue("id")+" not found")
			return
		}
		w.WriteHeader(204)
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.Path+qs(r.URL.RawQuery))
		f.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			writeError(w, 401, "unauthenticated", "missing or unknown API key")
			return
		}
		if ct := r.Header.Get("Content-Type"); ct == "application/json" {
			b, _ := io.ReadAll(r.Body)
			f.mu.Lock()
			f.bodies[r.Method+" "+r.URL.Path] = string(b)
			f.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func qs(q string) string {
	if q == "" {
		return ""
	}
	return "?" + q
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func (f *fakeSpaced) withSandbox(h func(http.ResponseWriter, *http.Request, client.Sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		sb, ok := f.sandboxes[r.PathValue("id")]
		f.mu.Unlock()
		if !ok {
			writeError(w, 404, "not_found", "sandbox "+r.PathValue("id")+" not found")
			return
		}
		h(w, r, sb)
	}
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// add stores a sandbox as if it had been created.
func (f *fakeSpaced) add(sb client.Sandbox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[sb.ID] = sb
	f.order = append(f.order, sb.ID)
}

func (f *fakeSpaced) create(w http.ResponseWriter, r *http.Request) {
	var req client.CreateSandboxRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, 400, "invalid_argument", err.Error())
		return
	}
	f.mu.Lock()
	release := f.release
	f.mu.Unlock()
	if release != nil {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
	}
	f.mu.Lock()
	f.next++
	id := fmt.Sprintf("sbx_%d", f.next)
	f.mu.Unlock()
	sb := client.Sandbox{ID: id, State: "running", Template: req.Template, Runtime: "gvisor",
		CreatedAt: t0, ExpiresAt: t0.Add(time.Duration(req.TimeoutSeconds) * time.Second),
		Metadata: req.Metadata, Resources: req.Resources}
	f.add(sb)
	writeJSON(w, 201, sb)
}

func (f *fakeSpaced) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []client.Sandbox{}
	for _, id := range f.order {
		sb, ok := f.sandboxes[id]
		if !ok {
			continue
		}
		if st := r.URL.Query().Get("state"); st != "" && sb.State != st {
			continue
		}
		match := true
		for k, v := range r.URL.Query() {
			if mk, ok := strings.CutPrefix(k, "metadata."); ok && sb.Metadata[mk] != v[0] {
				match = false
			}
		}
		if match {
			out = append(out, sb)
		}
	}
	writeJSON(w, 200, map[string]any{"sandboxes": out})
}

// exec fakes a command: it prints "out: <argv or command>" on stdout and "err" on stderr, and
// exits with the code in its CODE environment variable.
func (f *fakeSpaced) exec(w http.ResponseWriter, r *http.Request, _ client.Sandbox) {
	var req client.ExecRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, 400, "invalid_argument", err.Error())
		return
	}
	if req.Background {
		writeJSON(w, 202, map[string]int{"pid": 42})
		return
	}
	if len(req.Cmd) == 3 && req.Cmd[2] == loginShellLookup {
		f.mu.Lock()
		passwd := f.passwd
		f.mu.Unlock()
		code := 0
		if passwd == "" {
			code = 2
		}
		writeJSON(w, 200, client.ExecResult{PID: 8, ExitCode: code, Stdout: passwd})
		return
	}
	what := req.Command
	if what == "" {
		what = strings.Join(req.Cmd, " ")
	}
	if req.Stdin != nil {
		what += " <" + *req.Stdin
	}
	code, _ := strconv.Atoi(req.Env["CODE"])
	if r.Header.Get("Accept") != "text/event-stream" {
		writeJSON(w, 200, client.ExecResult{PID: 7, ExitCode: code, Stdout: "out: " + what + "\n", Stderr: "err\n", DurationMs: 5})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(typ string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		w.(http.Flusher).Flush()
	}
	send("start", map[string]int{"pid": 7})
	send("stdout", map[string]string{"data": "out: " + what + "\n"})
	send("stderr", map[string]string{"data_b64": "ZXJyCg=="}) // "err\n"
	if req.Env["HANG"] != "" {
		<-r.Context().Done()
		return
	}
	if req.Env["FAIL"] != "" {
		send("error", map[string]string{"code": "unavailable", "message": "agent went away"})
		return
	}
	send("exit", map[string]any{"exit_code": code, "duration_ms": 5})
}

// processEvents fakes an interactive shell: a prompt, then each line of stdin echoed back,
// until the line "exit N", or the end of stdin (then it exits 3, as after a failed command).
func (f *fakeSpaced) processEvents(w http.ResponseWriter, r *http.Request, _ client.Sandbox) {
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(typ string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		w.(http.Flusher).Flush()
	}
	send("start", map[string]int{"pid": 42})
	send("stdout", map[string]string{"data": "$ "})
	var line []byte
	for {
		select {
		case <-r.Context().Done():
			return
		case b := <-f.stdin:
			if b == nil {
				send("exit", map[string]any{"exit_code": 3})
				return
			}
			line = append(line, b...)
			for {
				i := bytes.IndexByte(line, '\n')
				if i < 0 {
					break
				}
				cmd := string(line[:i])
				line = line[i+1:]
				if n, ok := strings.CutPrefix(cmd, "exit "); ok {
					code, _ := strconv.Atoi(n)
					send("exit", map[string]any{"exit_code": code})
					return
				}
				send("stdout", map[string]string{"data": cmd + "\r\n$ "})
			}
		}
	}
}

// cli runs the CLI in-process against the fake with the given environment and stdin.
func (f *fakeSpaced) cli(t *testing.T, env map[string]string, stdin io.Reader, args ...string) (int, string, string) {
	t.Helper()
	if env == nil {
		env = map[string]string{"SPACE_URL": f.srv.URL, "SPACE_API_KEY": testKey}
	}
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var stdout, stderr bytes.Buffer
	a := &app{
		ctx: context.Background(), stdin: stdin, stdout: &stdout, stderr: &stderr,
		getenv: func(k string) string { return env[k] },
	}
	code := a.main(args)
	return code, stdout.String(), stderr.String()
}

func (f *fakeSpaced) body(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[key]
}

func (f *fakeSpaced) file(key string) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[key]
}

func (f *fakeSpaced) lastRequest() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		return ""
	}
	return f.requests[len(f.requests)-1]
}

func jsonEqual(t *testing.T, want, got string) {
	t.Helper()
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want is not JSON: %v", err)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("got is not JSON: %q: %v", got, err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("JSON (-want +got):\n%s", diff)
	}
}

func TestCreate(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantBody string
		wantOut  string
	}{
		{"defaults", []string{"create"}, `{}`, "sbx_1\n"},
		{"every flag", []string{"create", "--template", "minimal", "--timeout", "300", "--env", "A=1", "--env", "B=x=y",
			"--meta", "team=ml", "--memory", "512", "--vcpus", "2"},
			`{"template":"minimal","timeout_seconds":300,"env":{"A":"1","B":"x=y"},"metadata":{"team":"ml"},
			  "resources":{"vcpus":2,"memory_mib":512}}`, "sbx_1\n"},
		{"single-dash flags and = form", []string{"create", "-template=minimal", "-vcpus=1"},
			`{"template":"minimal","resources":{"vcpus":1}}`, "sbx_1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			code, out, errOut := f.cli(t, nil, nil, tt.args...)
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			if out != tt.wantOut {
				t.Errorf("stdout = %q, want %q", out, tt.wantOut)
			}
			jsonEqual(t, tt.wantBody, f.body("POST /v1/sandboxes"))
		})
	}

	// --json anywhere: before the command or after it.
	for _, args := range [][]string{{"--json", "create", "--meta", "k=v"}, {"create", "--meta", "k=v", "--json"}} {
		f := newFake(t)
		code, out, _ := f.cli(t, nil, nil, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d", args, code)
		}
		var sb client.Sandbox
		if err := json.Unmarshal([]byte(out), &sb); err != nil {
			t.Fatalf("%q: output is not a sandbox: %v\n%s", args, err, out)
		}
		if sb.ID != "sbx_1" || sb.Metadata["k"] != "v" || sb.State != "running" {
			t.Errorf("%q: sandbox = %+v", args, sb)
		}
	}
}

func seed(f *fakeSpaced) {
	f.add(client.Sandbox{ID: "sbx_a", State: "running", Template: "minimal", Runtime: "gvisor", CreatedAt: t0,
		ExpiresAt: t0.Add(5 * time.Minute), Metadata: map[string]string{"team": "ml", "env": "dev"}})
	f.add(client.Sandbox{ID: "sbx_long_identifier", State: "paused", Template: "base", Runtime: "gvisor", CreatedAt: t0.Add(time.Hour)})
}

func TestList(t *testing.T) {
	f := newFake(t)
	seed(f)
	code, out, errOut := f.cli(t, nil, nil, "ls")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "" +
		"ID                   STATE    TEMPLATE  RUNTIME  CREATED               EXPIRES               METADATA\n" +
		"sbx_a                running  minimal   gvisor   2026-01-02T03:04:05Z  2026-01-02T03:09:05Z  env=dev,team=ml\n" +
		"sbx_long_identifier  paused   base      gvisor   2026-01-02T04:04:05Z  -                     -\n"
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}

	code, out, _ = f.cli(t, nil, nil, "ls", "--state", "running", "--meta", "team=ml", "--json")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if got, want := f.lastRequest(), "GET /v1/sandboxes?metadata.team=ml&state=running"; got != want {
		t.Errorf("request = %q, want %q", got, want)
	}
	var list []client.Sandbox
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if len(list) != 1 || list[0].ID != "sbx_a" {
		t.Errorf("filtered list = %+v", list)
	}

	// An empty list is still a JSON array.
	_, out, _ = f.cli(t, nil, nil, "ls", "--state", "error", "--json")
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("empty --json list = %q, want []", out)
	}
}

func TestInfo(t *testing.T) {
	f := newFake(t)
	f.add(client.Sandbox{ID: "sbx_a", State: "running", Template: "minimal", Runtime: "gvisor", CreatedAt: t0,
		Metadata:  map[string]string{"k": "v"},
		Resources: &client.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048},
		Network:   &client.NetworkSpec{Egress: &client.Egress{Default: "deny", Allow: []string{"pypi.org"}}, Credentials: []string{"github"}},
		Parent:    &client.Parent{SnapshotID: "snp_1"}})

	code, out, _ := f.cli(t, nil, nil, "info", "sbx_a")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	want := "" +
		"ID:          sbx_a\n" +
		"State:       running\n" +
		"Template:    minimal\n" +
		"Runtime:     gvisor\n" +
		"Created:     2026-01-02T03:04:05Z\n" +
		"Expires:     -\n" +
		"Metadata:    k=v\n" +
		"Resources:   1 vCPU, 512 MiB memory, 2048 MiB disk\n" +
		"Egress:      default deny; allow pypi.org\n" +
		"Credentials: github\n" +
		"Parent:      snp_1\n"
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("sandbox info (-want +got):\n%s", diff)
	}

	code, out, _ = f.cli(t, nil, nil, "info")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	want = "" +
		"Version:          0.1.0-test\n" +
		"Default runtime:  gvisor\n" +
		"\n" +
		"RUNTIME      AVAILABLE  REASON\n" +
		"firecracker  no         no /dev/kvm\n" +
		"gvisor       yes        -\n"
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("server info (-want +got):\n%s", diff)
	}

	code, out, _ = f.cli(t, nil, nil, "info", "--json")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	jsonEqual(t, `{"version":"0.1.0-test","default_runtime":"gvisor","runtimes":[{"name":"gvisor","available":true},
		{"name":"firecracker","available":false,"reason":"no /dev/kvm"}]}`, out)
}

func TestExec(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		stdin      string
		wantCode   int
		wantOut    string
		wantErr    string
		wantBody   string
		wantAccept string
	}{
		{
			name: "argv after --", args: []string{"exec", "sbx_a", "--env", "CODE=3", "--cwd", "/tmp", "--user", "nobody", "--timeout", "9", "--", "ls", "-la", "--json"},
			wantCode: 3, wantOut: "out: ls -la --json\n", wantErr: "err\n",
			wantBody: `{"cmd":["ls","-la","--json"],"env":{"CODE":"3"},"cwd":"/tmp","user":"nobody","timeout_seconds":9}`,
		},
		{
			name: "argv without --", args: []string{"exec", "sbx_a", "echo", "-n", "hi"},
			wantOut: "out: echo -n hi\n", wantErr: "err\n",
			wantBody: `{"cmd":["echo","-n","hi"]}`,
		},
		{
			name: "shell string", args: []string{"exec", "-c", "echo hi | tr a-z A-Z", "sbx_a"},
			wantOut: "out: echo hi | tr a-z A-Z\n", wantErr: "err\n",
			wantBody: `{"command":"echo hi | tr a-z A-Z"}`,
		},
		{
			name: "stdin", args: []string{"exec", "sbx_a", "-i", "-c", "cat"}, stdin: "data",
			wantOut: "out: cat <data\n", wantErr: "err\n",
			wantBody: `{"command":"cat","stdin":"data"}`,
		},
		{
			name: "json", args: []string{"--json", "exec", "sbx_a", "--env", "CODE=4", "--", "true"},
			wantCode: 4, wantOut: "{\n  \"pid\": 7,\n  \"exit_code\": 4,\n  \"stdout\": \"out: true\\n\",\n  \"stderr\": \"err\\n\",\n  \"duration_ms\": 5\n}\n",
			wantBody: `{"cmd":["true"],"env":{"CODE":"4"}}`,
		},
		{
			name: "error event", args: []string{"exec", "sbx_a", "--env", "FAIL=1", "--", "x"},
			wantCode: 1, wantOut: "out: x\n", wantErr: "err\nspace: agent went away\n",
			wantBody: `{"cmd":["x"],"env":{"FAIL":"1"}}`,
		},
		{
			name: "missing sandbox", args: []string{"exec", "sbx_nope", "--", "ls"},
			wantCode: 1, wantErr: "space: sandbox sbx_nope not found\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			seed(f)
			code, out, errOut := f.cli(t, nil, strings.NewReader(tt.stdin), tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.wantCode, errOut)
			}
			if out != tt.wantOut {
				t.Errorf("stdout = %q, want %q", out, tt.wantOut)
			}
			if errOut != tt.wantErr {
				t.Errorf("stderr = %q, want %q", errOut, tt.wantErr)
			}
			if tt.wantBody != "" {
				jsonEqual(t, tt.wantBody, f.body("POST /v1/sandboxes/sbx_a/exec"))
			}
		})
	}
}

// TestExecInterrupt checks that an interrupted exec exits 130 quietly and interrupts the
// remote command too.
func TestExecInterrupt(t *testing.T) {
	f := newFake(t)
	seed(f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	a := &app{ctx: ctx, stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
		getenv: envMap{"SPACE_URL": f.srv.URL, "SPACE_API_KEY": testKey}.get}
	done := make(chan int, 1)
	go func() { done <- a.main([]string{"exec", "sbx_a", "--env", "HANG=1", "--", "sleep", "1000"}) }()
	waitFor(t, "the first output", func() bool { return strings.Contains(stdout.String(), "out: sleep 1000") })
	cancel()
	select {
	case code := <-done:
		if code != 130 {
			t.Errorf("exit %d, want 130", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exec did not stop when interrupted")
	}
	if stderr.String() != "err\n" {
		t.Errorf("stderr = %q, want only the command's", stderr.String())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if diff := cmp.Diff([]string{"7 SIGINT"}, f.signals); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
}

func TestCopy(t *testing.T) {
	f := newFake(t)
	seed(f)
	dir := t.TempDir()
	src := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(src, []byte("file content"), 0o750); err != nil {
		t.Fatal(err)
	}

	// Upload from a file, keeping its mode; to a directory path, keeping its name.
	for _, tt := range []struct{ dst, wantPath string }{
		{"sbx_a:/work/x.txt", "/work/x.txt"},
		{"sbx_a:/work/", "/work/in.txt"},
	} {
		if code, _, errOut := f.cli(t, nil, nil, "cp", src, tt.dst); code != 0 {
			t.Fatalf("cp %s %s: exit %d: %s", src, tt.dst, code, errOut)
		}
		if got := string(f.file("sbx_a:" + tt.wantPath)); got != "file content" {
			t.Errorf("uploaded %s = %q", tt.wantPath, got)
		}
		if got, want := f.lastRequest(), "PUT /v1/sandboxes/sbx_a/files?mode=0750&path="+strings.ReplaceAll(tt.wantPath, "/", "%2F"); got != want {
			t.Errorf("request = %q, want %q", got, want)
		}
	}

	// Upload from stdin, with --json.
	code, out, _ := f.cli(t, nil, strings.NewReader("from stdin"), "cp", "--json", "-", "sbx_a:/s.txt")
	if code != 0 || string(f.file("sbx_a:/s.txt")) != "from stdin" {
		t.Fatalf("cp - : exit %d, stored %q", code, f.file("sbx_a:/s.txt"))
	}
	jsonEqual(t, `{"path":"/s.txt","size":10}`, out)

	// Download to stdout, to a file, into a directory.
	code, out, _ = f.cli(t, nil, nil, "cp", "sbx_a:/s.txt", "-")
	if code != 0 || out != "from stdin" {
		t.Errorf("cp to stdout: exit %d, out %q", code, out)
	}
	dst := filepath.Join(dir, "out.txt")
	if code, _, errOut := f.cli(t, nil, nil, "cp", "sbx_a:/work/x.txt", dst); code != 0 {
		t.Fatalf("cp to file: exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(dst); string(b) != "file content" {
		t.Errorf("downloaded file = %q", b)
	}
	if code, _, errOut := f.cli(t, nil, nil, "cp", "sbx_a:/s.txt", dir); code != 0 {
		t.Fatalf("cp into dir: exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "s.txt")); string(b) != "from stdin" {
		t.Errorf("downloaded into dir = %q", b)
	}

	// A missing remote file fails cleanly and leaves nothing behind.
	code, _, errOut := f.cli(t, nil, nil, "cp", "sbx_a:/nope", filepath.Join(dir, "nope"))
	if code != 1 || errOut != "space: no such file: /nope\n" {
		t.Errorf("cp of a missing file: exit %d, stderr %q", code, errOut)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if diff := cmp.Diff([]string{"in.txt", "out.txt", "s.txt"}, names); diff != "" {
		t.Errorf("local files (-want +got):\n%s", diff)
	}
}

func TestParseRemote(t *testing.T) {
	tests := []struct {
		in   string
		want remotePath
		ok   bool
	}{
		{"sbx_1:/a/b", remotePath{"sbx_1", "/a/b"}, true},
		{"sbx_1:/", remotePath{"sbx_1", "/"}, true},
		{"sbx_1:rel", remotePath{}, false},
		{"./a:/b", remotePath{}, false},
		{"/abs/file", remotePath{}, false},
		{":/x", remotePath{}, false},
		{"-", remotePath{}, false},
		{`C:\x`, remotePath{}, false},
	}
	for _, tt := range tests {
		got, ok := parseRemote(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseRemote(%q) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestRemove(t *testing.T) {
	f := newFake(t)
	seed(f)
	code, out, errOut := f.cli(t, nil, nil, "rm", "sbx_a", "sbx_missing", "sbx_long_identifier")
	if code != 1 {
		t.Errorf("exit %d, want 1 (one failed)", code)
	}
	if out != "sbx_a\nsbx_long_identifier\n" {
		t.Errorf("stdout = %q", out)
	}
	if errOut != "space: sbx_missing: sandbox sbx_missing not found\n" {
		t.Errorf("stderr = %q", errOut)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sandboxes) != 0 {
		t.Errorf("sandboxes left: %v", f.sandboxes)
	}
}

func TestKey(t *testing.T) {
	f := newFake(t)
	code, out, _ := f.cli(t, nil, nil, "key", "create", "acme")
	if code != 0 || out != "sk_acme\n" {
		t.Errorf("key create: exit %d, out %q", code, out)
	}
	jsonEqual(t, `{"tenant":"acme"}`, f.body("POST /v1/keys"))
	code, out, _ = f.cli(t, nil, nil, "keys", "ls")
	if code != 0 || !strings.Contains(out, "key_1") || !strings.Contains(out, "acme") || strings.Contains(out, "sk_") {
		t.Errorf("keys ls: exit %d, out %q", code, out)
	}
	code, out, _ = f.cli(t, nil, nil, "keys", "rm", "key_2")
	if code != 0 || out != "key_2\n" || f.lastRequest() != "DELETE /v1/keys/key_2" {
		t.Errorf("keys rm: exit %d, out %q, request %q", code, out, f.lastRequest())
	}
	if code, _, errOut := f.cli(t, nil, nil, "keys", "rm", "key_9"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("keys rm of an unknown key: exit %d, stderr %q", code, errOut)
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string // a substring of stderr
	}{
		{nil, "usage: space"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"exec"}, "exec needs a sandbox ID"},
		{[]string{"exec", "sbx_a"}, "exec needs a command"},
		{[]string{"exec", "sbx_a", "-c", "ls", "--", "ls"}, "not both"},
		{[]string{"exec", "sbx_a", "--timeout", "-1", "--", "ls"}, "must not be negative"},
		{[]string{"exec", "sbx_a", "--bogus", "--", "ls"}, "flag provided but not defined: -bogus"},
		{[]string{"create", "--env", "NOEQUALS"}, "want KEY=VALUE"},
		{[]string{"create", "extra"}, "create takes no arguments"},
		{[]string{"create", "--vcpus", "many"}, "invalid value"},
		{[]string{"ls", "x"}, "ls takes no arguments"},
		{[]string{"info", "a", "b"}, "at most one"},
		{[]string{"rm"}, "at least one"},
		{[]string{"cp", "a"}, "source and a destination"},
		{[]string{"cp", "a", "b"}, "exactly one side"},
		{[]string{"cp", "sbx_a:/x", "sbx_b:/y"}, "exactly one side"},
		{[]string{"cp", "-", "sbx_a:/dir/"}, "needs a file name"},
		{[]string{"shell"}, "shell needs a sandbox ID"},
		{[]string{"version", "x"}, "version takes no arguments"},
		{[]string{"key", "delete", "x"}, "space key create TENANT"},
		{[]string{"keys", "rm"}, "space key create TENANT | ls | rm KEY_ID..."},
		{[]string{"keys", "ls", "x"}, "space key create TENANT | ls | rm KEY_ID..."},
		{[]string{"--url", "ftp://x", "ls"}, "scheme must be http"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			f := newFake(t)
			code, _, errOut := f.cli(t, nil, nil, tt.args...)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("stderr %q does not contain %q", errOut, tt.wantErr)
			}
			if r := f.lastRequest(); r != "" {
				t.Errorf("a usage error still sent %s", r)
			}
		})
	}
	// help is not an error.
	f := newFake(t)
	// The usage is printed once, on stdout.
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, errOut := f.cli(t, nil, nil, args...)
		if code != 0 || strings.Count(out, "usage: space") != 1 || !strings.Contains(out, "commands:") || errOut != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	// A bad global flag: the problem and the usage once, on stderr.
	if code, out, errOut := f.cli(t, nil, nil, "--bogus", "ls"); code != 2 || out != "" || strings.Count(errOut, "usage: space") != 1 ||
		!strings.Contains(errOut, "flag provided but not defined: -bogus") {
		t.Errorf("--bogus: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, _ := f.cli(t, nil, nil, "ls", "-h"); code != 0 {
		t.Errorf("ls -h: exit %d, want 0", code)
	}
}

func TestServerAndKeyDiscovery(t *testing.T) {
	f := newFake(t)
	seed(f)
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "admin.key"), []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badHome := t.TempDir()
	if err := os.WriteFile(filepath.Join(badHome, "admin.key"), []byte("sk_old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	const refused = "space: missing or unknown API key\n"
	// How to set a key: every refusal says it.
	const how = "  set SPACE_API_KEY or pass --key, or set SPACE_HOME to the spaced home that holds admin.key\n"
	tests := []struct {
		name     string
		env      map[string]string
		args     []string
		wantCode int
		wantErr  string // the first lines of stderr
	}{
		{"env key", map[string]string{"SPACE_URL": f.srv.URL, "SPACE_API_KEY": testKey}, nil, 0, ""},
		{"key file in SPACE_HOME", map[string]string{"SPACE_URL": f.srv.URL, "SPACE_HOME": home}, nil, 0, ""},
		{"env key wins over the file", map[string]string{"SPACE_URL": f.srv.URL, "SPACE_HOME": home, "SPACE_API_KEY": "wrong"}, nil,
			1, refused + "  the key came from SPACE_API_KEY\n" + how},
		{"--key wins over env", map[string]string{"SPACE_URL": f.srv.URL, "SPACE_API_KEY": "wrong"}, []string{"--key", testKey}, 0, ""},
		{"wrong --key", map[string]string{"SPACE_URL": f.srv.URL}, []string{"--key", "wrong"}, 1, refused + "  the key came from --key\n" + how},
		{"stale key file", map[string]string{"SPACE_URL": f.srv.URL, "SPACE_HOME": badHome}, nil,
			1, refused + "  the key came from the file " + filepath.Join(badHome, "admin.key") + "\n" + how},
		{"--url wins over env", map[string]string{"SPACE_URL": "http://127.0.0.1:1", "SPACE_API_KEY": testKey}, []string{"--url", f.srv.URL}, 0, ""},
		{"no key anywhere", map[string]string{"SPACE_URL": f.srv.URL, "SPACE_HOME": empty}, nil,
			1, refused + "  no API key: --key not given, SPACE_API_KEY not set, no file " + filepath.Join(empty, "admin.key") + "\n" + how},
		// Run from a directory without .space: the path it looked at is absolute.
		{"no key in ./.space", map[string]string{"SPACE_URL": f.srv.URL}, nil,
			1, refused + "  no API key: --key not given, SPACE_API_KEY not set, no file " + filepath.Join(cwd, ".space", "admin.key") + "\n" + how},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{}, tt.args...), "ls")
			code, _, errOut := f.cli(t, tt.env, nil, args...)
			if code != tt.wantCode || !strings.HasPrefix(errOut, tt.wantErr) || (tt.wantErr == "") != (errOut == "") {
				t.Errorf("exit %d, stderr %q; want %d, %q...", code, errOut, tt.wantCode, tt.wantErr)
			}
		})
	}
}

// TestRun drives the real entry point, with the real environment.
func TestRun(t *testing.T) {
	f := newFake(t)
	seed(f)
	t.Setenv("SPACE_URL", f.srv.URL)
	t.Setenv("SPACE_API_KEY", testKey)
	var out, errOut bytes.Buffer
	if code := run([]string{"ls", "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var list []client.Sandbox
	if err := json.Unmarshal(out.Bytes(), &list); err != nil || len(list) != 2 {
		t.Errorf("ls --json = %q (%v)", out.String(), err)
	}
	// The default server: nothing listens on port 1 of loopback, so the failure is a network one.
	t.Setenv("SPACE_URL", "http://127.0.0.1:1")
	out.Reset()
	errOut.Reset()
	if code := run([]string{"ls"}, &out, &errOut); code != 1 || !strings.HasPrefix(errOut.String(), "space: ") {
		t.Errorf("unreachable server: exit %d, stderr %q", code, errOut.String())
	}
}

// fakeTerminal is a terminal whose size the test sets.
type fakeTerminal struct {
	mu         sync.Mutex
	cols, rows int
	raw        bool
	rawCalls   int
	resize     chan<- struct{}
	registered chan struct{}
}

func (ft *fakeTerminal) IsTerminal() bool { return true }
func (ft *fakeTerminal) Size() (int, int, error) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return ft.cols, ft.rows, nil
}
func (ft *fakeTerminal) MakeRaw() (func() error, error) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.raw = true
	ft.rawCalls++
	return func() error {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		ft.raw = false
		return nil
	}, nil
}
func (ft *fakeTerminal) NotifyResize(ch chan<- struct{}) func() {
	ft.mu.Lock()
	ft.resize = ch
	ft.mu.Unlock()
	close(ft.registered)
	return func() {}
}

func TestShell(t *testing.T) {
	f := newFake(t)
	seed(f)
	f.passwd = "user:x:1000:1000::/home/user:/bin/bash\n"
	ft := &fakeTerminal{cols: 100, rows: 30, registered: make(chan struct{})}
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	var stdout, stderr syncBuffer
	a := &app{
		ctx: context.Background(), stdin: stdinR, stdout: &stdout, stderr: &stderr,
		getenv: envMap{"SPACE_URL": f.srv.URL, "SPACE_API_KEY": testKey, "TERM": "vt100"}.get,
		term:   ft,
	}
	done := make(chan int, 1)
	go func() { done <- a.main([]string{"shell", "sbx_a"}) }()

	waitFor(t, "the prompt", func() bool { return strings.Contains(stdout.String(), "$ ") })
	// Keystrokes arrive one write at a time, as from a raw terminal.
	for _, k := range []string{"l", "s", "\n"} {
		stdinW.Write([]byte(k))
	}
	waitFor(t, "the echoed command", func() bool { return strings.Contains(stdout.String(), "ls\r\n$ ") })

	<-ft.registered
	ft.mu.Lock()
	ft.cols, ft.rows = 120, 40
	ch := ft.resize
	ft.mu.Unlock()
	ch <- struct{}{}
	waitFor(t, "the resize", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.resizes) == 1
	})

	stdinW.Write([]byte("exit 5\n"))
	select {
	case code := <-done:
		if code != 5 {
			t.Errorf("shell exit %d, want 5 (stderr %q)", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shell did not end after the remote shell exited")
	}

	jsonEqual(t, `{"cmd":["/bin/bash","-l"],"env":{"TERM":"vt100"},"background":true,"pty":{"cols":100,"rows":30}}`,
		f.body("POST /v1/sandboxes/sbx_a/exec"))
	f.mu.Lock()
	if diff := cmp.Diff([]client.PTYSize{{Cols: 120, Rows: 40}}, f.resizes); diff != "" {
		t.Errorf("resizes (-want +got):\n%s", diff)
	}
	f.mu.Unlock()
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if ft.rawCalls != 1 || ft.raw {
		t.Errorf("raw mode: %d calls, still raw %v; want 1 call, restored", ft.rawCalls, ft.raw)
	}
}

type envMap map[string]string

func (m envMap) get(k string) string { return m[k] }

// syncBuffer is a bytes.Buffer safe to read while the CLI writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestShellEndOfInput: with standard input a file (not a terminal), the shell gets no PTY, what
// the file holds goes to it, its end closes the shell's standard input, and space shell ends with
// the shell's status.
func TestShellEndOfInput(t *testing.T) {
	f := newFake(t)
	seed(f)
	done := make(chan int, 1)
	var stdout, stderr string
	go func() {
		var code int
		code, stdout, stderr = f.cli(t, nil, strings.NewReader("echo hi\n"), "shell", "sbx_a")
		done <- code
	}()
	select {
	case code := <-done:
		if code != 3 {
			t.Errorf("exit %d, want the shell's 3 (stderr %q)", code, stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("space shell did not end at the end of its input")
	}
	if want := "$ echo hi\r\n$ "; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	jsonEqual(t, `{"cmd":["/bin/sh","-l"],"background":true}`, f.body("POST /v1/sandboxes/sbx_a/exec"))
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.requests); n < 2 || f.requests[n-1] != "POST /v1/sandboxes/sbx_a/processes/42/stdin?eof=true" {
		t.Errorf("last request %q, want stdin closed", f.requests[n-1])
	}
}

func TestShellLoginShell(t *testing.T) {
	tests := []struct {
		name   string
		passwd string // "" fails the lookup
		args   []string
		want   string // the background exec's cmd, as JSON
	}{
		{"bash", "user:x:1000:1000::/home/user:/bin/bash\n", nil, `["/bin/bash","-l"]`},
		{"zsh, first entry", "dev:x:1001:1001::/home/dev:/usr/bin/zsh\nother:x:1:1::/:/bin/bash\n", nil, `["/usr/bin/zsh","-l"]`},
		{"nologin", "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n", nil, `["/bin/sh","-l"]`},
		{"false", "svc:x:999:999::/:/bin/false\n", nil, `["/bin/sh","-l"]`},
		{"no shell field", "user:x:1000:1000::/home/user:\n", nil, `["/bin/sh","-l"]`},
		{"relative shell", "user:x:1000:1000::/home/user:bash\n", nil, `["/bin/sh","-l"]`},
		{"garbage", "getent: not found\n", nil, `["/bin/sh","-l"]`},
		{"lookup fails", "", nil, `["/bin/sh","-l"]`},
		{"a command is not looked up", "user:x:1000:1000::/home/user:/bin/bash\n", []string{"--", "python3", "-q"}, `["python3","-q"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			seed(f)
			f.passwd = tt.passwd
			args := append([]string{"shell", "sbx_a"}, tt.args...)
			if code, _, errOut := f.cli(t, nil, strings.NewReader(""), args...); code != 3 {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			jsonEqual(t, `{"cmd":`+tt.want+`,"background":true}`, f.body("POST /v1/sandboxes/sbx_a/exec"))
			f.mu.Lock()
			defer f.mu.Unlock()
			execs := 0
			for _, r := range f.requests {
				if r == "POST /v1/sandboxes/sbx_a/exec" {
					execs++
				}
			}
			if want := map[bool]int{true: 1, false: 2}[len(tt.args) > 0]; execs != want {
				t.Errorf("%d execs, want %d", execs, want)
			}
		})
	}
	// An unknown sandbox is an error, not a fallback.
	f := newFake(t)
	if code, _, errOut := f.cli(t, nil, nil, "shell", "sbx_nope"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("unknown sandbox: exit %d, stderr %q", code, errOut)
	}
}

func TestVersion(t *testing.T) {
	f := newFake(t)
	code, out, errOut := f.cli(t, nil, nil, "version")
	if want := "space dev\nspaced 0.1.0-test (" + f.srv.URL + ")\n"; code != 0 || out != want || errOut != "" {
		t.Errorf("version: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
	}
	code, out, _ = f.cli(t, nil, nil, "version", "--json")
	if code != 0 {
		t.Errorf("version --json: exit %d", code)
	}
	jsonEqual(t, `{"cli":"dev","server":"0.1.0-test","url":"`+f.srv.URL+`"}`, out)

	// No server: the CLI's version still, and a note of why the server's is missing.
	code, out, errOut = f.cli(t, map[string]string{"SPACE_URL": "http://127.0.0.1:1", "SPACE_API_KEY": testKey}, nil, "version")
	if code != 0 || out != "space dev\n" || !strings.HasPrefix(errOut, "space: server http://127.0.0.1:1: ") {
		t.Errorf("no server: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// A server that refuses the key: the note says where the key came from.
	code, out, errOut = f.cli(t, map[string]string{"SPACE_URL": f.srv.URL, "SPACE_API_KEY": "wrong"}, nil, "version")
	if code != 0 || out != "space dev\n" || !strings.Contains(errOut, "unknown API key") || !strings.Contains(errOut, "the key came from SPACE_API_KEY") {
		t.Errorf("refused key: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestCreateWaiting: a create that does not answer at once says on stderr what it waits for —
// a template not built yet, or only the server — and how long it has waited; a quick one says
// nothing.
func TestCreateWaiting(t *testing.T) {
	tests := []struct {
		name      string
		built     []string
		args      []string
		wantFirst string
	}{
		{"base not built", []string{"minimal"}, nil, "space: template base is not built yet; the server is building it (base takes a few minutes on spaced's first start): building base, installing remaining packages inside the chroot, 50 of 212 done\n"},
		{"named template not built", nil, []string{"--template", "app"}, "space: template app is not built yet"},
		{"template built", []string{"base"}, nil, "space: waiting for the server to start the sandbox\n"},
		{"from a snapshot", nil, []string{"--from-snapshot", "snp_1"}, "space: waiting for the server to start the sandbox\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.templates, f.release = tt.built, make(chan struct{})
			f.builds = []client.BuildProgress{{Template: "base", StartedAt: t0, Step: "installing remaining packages inside the chroot", Done: 50, Total: 212}}
			var stdout, stderr syncBuffer
			a := &app{
				ctx: context.Background(), stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
				getenv: envMap{"SPACE_URL": f.srv.URL, "SPACE_API_KEY": testKey}.get, slowAfter: 20 * time.Millisecond,
			}
			done := make(chan int, 1)
			go func() { done <- a.main(append([]string{"create"}, tt.args...)) }()
			waitFor(t, "the second note", func() bool { return strings.Contains(stderr.String(), "space: still waiting (") })
			close(f.release)
			if code := <-done; code != 0 || stdout.String() != "sbx_1\n" {
				t.Fatalf("exit %d, stdout %q", code, stdout.String())
			}
			if got := stderr.String(); !strings.HasPrefix(got, tt.wantFirst) {
				t.Errorf("stderr %q, want it to start %q", got, tt.wantFirst)
			}
		})
	}
	// A quick create says nothing.
	f := newFake(t)
	if code, out, errOut := f.cli(t, nil, nil, "create"); code != 0 || out != "sbx_1\n" || errOut != "" {
		t.Errorf("quick create: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
