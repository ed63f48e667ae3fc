package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// recorded is one request as the fake server saw it.
type recorded struct {
	Method, Path, Query string
	Auth, Accept, CT    string
	Body                string
}

// fakeServer answers every request with a canned status and body and records what it got.
type fakeServer struct {
	mu     sync.Mutex
	got    []recorded
	status int
	body   string
	ct     string
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.got = append(f.got, recorded{
		Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery,
		Auth: r.Header.Get("Authorization"), Accept: r.Header.Get("Accept"),
		CT: r.Header.Get("Content-Type"), Body: string(b),
	})
	status, body, ct := f.status, f.body, f.ct
	f.mu.Unlock()
	if ct == "" {
		ct = "application/json"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func (f *fakeServer) last(t *testing.T) recorded {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.got) == 0 {
		t.Fatal("no request reached the server")
	}
	return f.got[len(f.got)-1]
}

func newTestClient(t *testing.T, h http.Handler) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL+"/prefix/", "sk_test", WithHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// jsonEq compares two JSON texts by value ("" matches only "").
func jsonEq(t *testing.T, want, got string) {
	t.Helper()
	if want == "" || got == "" {
		if want != got {
			t.Errorf("body = %q, want %q", got, want)
		}
		return
	}
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want JSON %q: %v", want, err)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("request body is not JSON: %q: %v", got, err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("request body (-want +got):\n%s", diff)
	}
}

func TestRequests(t *testing.T) {
	ctx := context.Background()
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sbJSON := `{"id":"sbx_1","state":"running","template":"minimal","runtime":"gvisor",
		"created_at":"2026-01-02T03:04:05Z","expires_at":"2026-01-02T03:09:05Z","metadata":{"k":"v"},
		"resources":{"vcpus":1,"memory_mib":512,"disk_mib":2048},
		"network":{"egress":{"default":"deny","allow":["api.example.com"]},"credentials":["github"]},
		"parent":{"sandbox_id":"sbx_0","snapshot_id":"snp_1"}}`
	wantSB := &Sandbox{
		ID: "sbx_1", State: "running", Template: "minimal", Runtime: "gvisor",
		CreatedAt: created, ExpiresAt: created.Add(5 * time.Minute), Metadata: map[string]string{"k": "v"},
		Resources: &Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048},
		Network:   &NetworkSpec{Egress: &Egress{Default: "deny", Allow: []string{"api.example.com"}}, Credentials: []string{"github"}},
		Parent:    &Parent{SandboxID: "sbx_0", SnapshotID: "snp_1"},
	}
	stdin := "input"
	exit0 := 0

	tests := []struct {
		name     string
		status   int
		respBody string
		call     func(c *Client) (any, error)
		want     recorded // Auth is always checked; Accept and CT when set
		wantBody string   // JSON compared by value; raw bodies compared in want.Body
		wantOut  any
	}{
		{
			name: "create sandbox", status: 201, respBody: sbJSON,
			call: func(c *Client) (any, error) {
				return c.CreateSandbox(ctx, CreateSandboxRequest{
					Template: "minimal", TimeoutSeconds: 300, OnTimeout: "pause",
					Env: map[string]string{"K": "V"}, Metadata: map[string]string{"k": "v"},
					Resources: &Resources{VCPUs: 2, MemoryMiB: 256},
					Network:   &NetworkSpec{Egress: &Egress{Default: "deny", Allow: []string{"*.pypi.org"}}, Credentials: []string{"github"}},
				})
			},
			want: recorded{Method: "POST", Path: "/prefix/v1/sandboxes", Accept: "application/json", CT: "application/json"},
			wantBody: `{"template":"minimal","timeout_seconds":300,"on_timeout":"pause","env":{"K":"V"},
				"metadata":{"k":"v"},"resources":{"vcpus":2,"memory_mib":256},
				"network":{"egress":{"default":"deny","allow":["*.pypi.org"]},"credentials":["github"]}}`,
			wantOut: wantSB,
		},
		{
			name: "create sandbox with no fields sends an empty object", status: 201, respBody: sbJSON,
			call:     func(c *Client) (any, error) { return c.CreateSandbox(ctx, CreateSandboxRequest{}) },
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes"},
			wantBody: `{}`, wantOut: wantSB,
		},
		{
			name: "get sandbox escapes the id", status: 200, respBody: sbJSON,
			call:    func(c *Client) (any, error) { return c.GetSandbox(ctx, "sbx/1 x") },
			want:    recorded{Method: "GET", Path: "/prefix/v1/sandboxes/sbx%2F1%20x"},
			wantOut: wantSB,
		},
		{
			name: "list sandboxes with filters", status: 200, respBody: `{"sandboxes":[` + sbJSON + `]}`,
			call: func(c *Client) (any, error) {
				return c.ListSandboxes(ctx, ListSandboxesOptions{State: "running", Metadata: map[string]string{"a": "1", "b c": "2&3"}})
			},
			want:    recorded{Method: "GET", Path: "/prefix/v1/sandboxes", Query: "metadata.a=1&metadata.b+c=2%263&state=running"},
			wantOut: []Sandbox{*wantSB},
		},
		{
			name: "delete sandbox", status: 204,
			call:    func(c *Client) (any, error) { return nil, c.DeleteSandbox(ctx, "sbx_1") },
			want:    recorded{Method: "DELETE", Path: "/prefix/v1/sandboxes/sbx_1"},
			wantOut: nil,
		},
		{
			name: "set timeout", status: 200, respBody: sbJSON,
			call:     func(c *Client) (any, error) { return c.SetTimeout(ctx, "sbx_1", 600) },
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/timeout"},
			wantBody: `{"timeout_seconds":600}`, wantOut: wantSB,
		},
		{
			name: "update network", status: 200, respBody: sbJSON,
			call: func(c *Client) (any, error) {
				return c.UpdateNetwork(ctx, "sbx_1", Egress{Default: "allow", Deny: []string{"evil.example"}})
			},
			want:     recorded{Method: "PATCH", Path: "/prefix/v1/sandboxes/sbx_1/network"},
			wantBody: `{"egress":{"default":"allow","deny":["evil.example"]}}`, wantOut: wantSB,
		},
		{
			name: "exec", status: 200, respBody: `{"pid":7,"exit_code":3,"stdout":"hi\n","stderr":"oops","duration_ms":12}`,
			call: func(c *Client) (any, error) {
				return c.Exec(ctx, "sbx_1", ExecRequest{Cmd: []string{"sh", "-c", "echo hi"}, Env: map[string]string{"A": "B"},
					Cwd: "/root", User: "root", Stdin: &stdin, TimeoutSeconds: 60, PTY: &PTYSize{Cols: 80, Rows: 24}})
			},
			want: recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/exec", Accept: "application/json", CT: "application/json"},
			wantBody: `{"cmd":["sh","-c","echo hi"],"env":{"A":"B"},"cwd":"/root","user":"root","stdin":"input",
				"timeout_seconds":60,"pty":{"cols":80,"rows":24}}`,
			wantOut: &ExecResult{PID: 7, ExitCode: 3, Stdout: "hi\n", Stderr: "oops", DurationMs: 12},
		},
		{
			name: "exec background", status: 202, respBody: `{"pid":9}`,
			call: func(c *Client) (any, error) {
				return c.ExecBackground(ctx, "sbx_1", ExecRequest{Command: "sleep 10"})
			},
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/exec"},
			wantBody: `{"command":"sleep 10","background":true}`, wantOut: 9,
		},
		{
			name: "list processes", status: 200,
			respBody: `{"processes":[{"pid":1,"cmd":["sleep","10"],"running":true,"exit_code":null,"started_at":"2026-01-02T03:04:05Z"},
				{"pid":2,"cmd":"echo hi","running":false,"exit_code":0,"started_at":"2026-01-02T03:04:05Z"}]}`,
			call: func(c *Client) (any, error) { return c.ListProcesses(ctx, "sbx_1") },
			want: recorded{Method: "GET", Path: "/prefix/v1/sandboxes/sbx_1/processes"},
			wantOut: []Process{
				{PID: 1, Cmd: Argv{"sleep", "10"}, Running: true, StartedAt: created},
				{PID: 2, Cmd: Argv{"echo hi"}, ExitCode: &exit0, StartedAt: created},
			},
		},
		{
			name: "write stdin", status: 204,
			call: func(c *Client) (any, error) {
				return nil, c.WriteStdin(ctx, "sbx_1", 7, strings.NewReader("ls\n"), false)
			},
			want:    recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/processes/7/stdin", CT: "application/octet-stream", Body: "ls\n"},
			wantOut: nil,
		},
		{
			name: "close stdin", status: 204,
			call:    func(c *Client) (any, error) { return nil, c.CloseStdin(ctx, "sbx_1", 7) },
			want:    recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/processes/7/stdin", Query: "eof=true"},
			wantOut: nil,
		},
		{
			name: "signal", status: 204,
			call:     func(c *Client) (any, error) { return nil, c.Signal(ctx, "sbx_1", 7, "SIGTERM") },
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/processes/7/signal"},
			wantBody: `{"signal":"SIGTERM"}`, wantOut: nil,
		},
		{
			name: "resize", status: 204,
			call:     func(c *Client) (any, error) { return nil, c.ResizePTY(ctx, "sbx_1", 7, PTYSize{Cols: 120, Rows: 40}) },
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/processes/7/resize"},
			wantBody: `{"cols":120,"rows":40}`, wantOut: nil,
		},
		{
			name: "upload with mode", status: 201, respBody: `{"path":"/a b/c.txt","size":5}`,
			call: func(c *Client) (any, error) {
				return c.Upload(ctx, "sbx_1", "/a b/c.txt", strings.NewReader("hello"), &UploadOptions{Mode: 0o755})
			},
			want: recorded{Method: "PUT", Path: "/prefix/v1/sandboxes/sbx_1/files", Query: "mode=0755&path=%2Fa+b%2Fc.txt",
				CT: "application/octet-stream", Body: "hello"},
			wantOut: &UploadResult{Path: "/a b/c.txt", Size: 5},
		},
		{
			name: "list dir", status: 200,
			respBody: `{"entries":[{"name":"a","path":"/w/a","type":"file","size":3,"mode":420,"modified_at":"2026-01-02T03:04:05Z"},
				{"name":"d","path":"/w/d","type":"dir","size":0,"mode":"0755","modified_at":"2026-01-02T03:04:05Z"}]}`,
			call: func(c *Client) (any, error) { return c.ListDir(ctx, "sbx_1", "/w") },
			want: recorded{Method: "GET", Path: "/prefix/v1/sandboxes/sbx_1/fs", Query: "path=%2Fw"},
			wantOut: []Entry{
				{Name: "a", Path: "/w/a", Type: "file", Size: 3, Mode: 0o644, ModifiedAt: created},
				{Name: "d", Path: "/w/d", Type: "dir", Mode: 0o755, ModifiedAt: created},
			},
		},
		{
			name: "mkdir", status: 204,
			call:     func(c *Client) (any, error) { return nil, c.Mkdir(ctx, "sbx_1", "/w/x") },
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/fs/mkdir"},
			wantBody: `{"path":"/w/x"}`, wantOut: nil,
		},
		{
			name: "move", status: 204,
			call:     func(c *Client) (any, error) { return nil, c.Move(ctx, "sbx_1", "/a", "/b") },
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/fs/move"},
			wantBody: `{"from":"/a","to":"/b"}`, wantOut: nil,
		},
		{
			name: "remove recursive", status: 204,
			call:    func(c *Client) (any, error) { return nil, c.Remove(ctx, "sbx_1", "/w", true) },
			want:    recorded{Method: "DELETE", Path: "/prefix/v1/sandboxes/sbx_1/files", Query: "path=%2Fw&recursive=true"},
			wantOut: nil,
		},
		{
			name: "info", status: 200,
			respBody: `{"version":"0.1.0","runtimes":[{"name":"gvisor","available":true},{"name":"firecracker","available":false,"reason":"no kvm"}],"default_runtime":"gvisor"}`,
			call:     func(c *Client) (any, error) { return c.Info(ctx) },
			want:     recorded{Method: "GET", Path: "/prefix/v1/info"},
			wantOut: &Info{Version: "0.1.0", DefaultRuntime: "gvisor", Runtimes: []RuntimeInfo{
				{Name: "gvisor", Available: true}, {Name: "firecracker", Reason: "no kvm"}}},
		},
		{
			name: "healthz", status: 200, respBody: "ok",
			call:    func(c *Client) (any, error) { return nil, c.Healthz(ctx) },
			want:    recorded{Method: "GET", Path: "/prefix/healthz"},
			wantOut: nil,
		},
		{
			name: "create key", status: 201, respBody: `{"id":"key_1","key":"sk_new","tenant":"acme"}`,
			call:     func(c *Client) (any, error) { return c.CreateKey(ctx, "acme") },
			want:     recorded{Method: "POST", Path: "/prefix/v1/keys"},
			wantBody: `{"tenant":"acme"}`, wantOut: &APIKey{ID: "key_1", Key: "sk_new", Tenant: "acme"},
		},
		{
			name: "list keys", status: 200, respBody: `{"keys":[{"id":"key_1","tenant":"acme","admin":false,"created_at":"2026-01-02T03:04:05Z"}]}`,
			call:    func(c *Client) (any, error) { return c.ListKeys(ctx) },
			want:    recorded{Method: "GET", Path: "/prefix/v1/keys"},
			wantOut: []KeyInfo{{ID: "key_1", Tenant: "acme", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
		},
		{
			name: "revoke key", status: 204,
			call:    func(c *Client) (any, error) { return nil, c.RevokeKey(ctx, "key_1") },
			want:    recorded{Method: "DELETE", Path: "/prefix/v1/keys/key_1"},
			wantOut: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeServer{status: tt.status, body: tt.respBody}
			c := newTestClient(t, f)
			out, err := tt.call(c)
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			got := f.last(t)
			if got.Method != tt.want.Method || got.Path != tt.want.Path || got.Query != tt.want.Query {
				t.Errorf("request = %s %s?%s, want %s %s?%s", got.Method, got.Path, got.Query, tt.want.Method, tt.want.Path, tt.want.Query)
			}
			if got.Auth != "Bearer sk_test" {
				t.Errorf("Authorization = %q", got.Auth)
			}
			if tt.want.Accept != "" && got.Accept != tt.want.Accept {
				t.Errorf("Accept = %q, want %q", got.Accept, tt.want.Accept)
			}
			if tt.want.CT != "" && got.CT != tt.want.CT {
				t.Errorf("Content-Type = %q, want %q", got.CT, tt.want.CT)
			}
			if tt.wantBody != "" {
				jsonEq(t, tt.wantBody, got.Body)
			} else if got.Body != tt.want.Body {
				t.Errorf("body = %q, want %q", got.Body, tt.want.Body)
			}
			if diff := cmp.Diff(tt.wantOut, derefNil(out)); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

// derefNil turns a typed nil result into an untyped nil, for comparing calls that return none.
func derefNil(v any) any {
	if v == nil {
		return nil
	}
	return v
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name   string
		status int
		ct     string
		body   string
		want   *Error
	}{
		{"api error", 404, "application/json", `{"error":{"code":"not_found","message":"sandbox sbx_x not found"}}`,
			&Error{Status: 404, Code: "not_found", Message: "sandbox sbx_x not found"}},
		{"conflict", 409, "application/json", `{"error":{"code":"conflict","message":"sandbox is paused"}}`,
			&Error{Status: 409, Code: "conflict", Message: "sandbox is paused"}},
		{"plain text body", 502, "text/plain", "bad gateway from proxy\n",
			&Error{Status: 502, Code: "bad_gateway", Message: "bad gateway from proxy"}},
		{"empty body", 401, "application/json", "",
			&Error{Status: 401, Code: "unauthenticated", Message: "Unauthorized"}},
		{"json without error object", 429, "application/json", `{"detail":"slow down"}`,
			&Error{Status: 429, Code: "resource_exhausted", Message: `{"detail":"slow down"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, &fakeServer{status: tt.status, ct: tt.ct, body: tt.body})
			_, err := c.GetSandbox(context.Background(), "sbx_x")
			var got *Error
			if !errors.As(err, &got) {
				t.Fatalf("error = %v (%T), want *Error", err, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if IsNotFound(err) != (tt.status == 404) {
				t.Errorf("IsNotFound = %v for status %d", IsNotFound(err), tt.status)
			}
		})
	}
}

func TestNew(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:7070", "ftp://x", "http://", "::"} {
		if _, err := New(u, "k"); err == nil {
			t.Errorf("New(%q) succeeded", u)
		}
	}
	// No key: no Authorization header at all.
	f := &fakeServer{status: 200}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c, err := New(srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Healthz(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.last(t); got.Auth != "" || got.Path != "/healthz" {
		t.Errorf("request without key: %+v", got)
	}
}

// sseWriter writes events to a streaming response.
type sseWriter struct {
	w http.ResponseWriter
}

func startSSE(w http.ResponseWriter) sseWriter {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	return sseWriter{w}
}

func (s sseWriter) send(typ, data string) {
	fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", typ, data)
	s.w.(http.Flusher).Flush()
}

func TestExecStreamDeliversEventsLive(t *testing.T) {
	release := make(chan struct{})
	var gotReq recorded
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotReq = recorded{Method: r.Method, Path: r.URL.Path, Accept: r.Header.Get("Accept"), Body: string(b)}
		s := startSSE(w)
		s.send("start", `{"pid":7}`)
		s.send("stdout", `{"data":"first\n"}`)
		// The rest of the response waits until the client has seen the first output.
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, ": keepalive\n\n")
		s.send("stderr", `{"data_b64":"/wA="}`)
		s.send("exit", `{"exit_code":3,"duration_ms":42}`)
	}))

	var events []ExecEvent
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.ExecStream(ctx, "sbx_1", ExecRequest{Command: "echo first"}, func(ev ExecEvent) error {
		ev.Raw = nil
		events = append(events, ev)
		if ev.Type == EventStdout {
			close(release)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ExecStream: %v", err)
	}
	if gotReq.Accept != "text/event-stream" || gotReq.Path != "/prefix/v1/sandboxes/sbx_1/exec" {
		t.Errorf("request = %+v", gotReq)
	}
	jsonEq(t, `{"command":"echo first"}`, gotReq.Body)
	want := []ExecEvent{
		{Type: "start", PID: 7},
		{Type: "stdout", Data: []byte("first\n")},
		{Type: "stderr", Data: []byte{0xff, 0x00}},
		{Type: "exit", ExitCode: 3, DurationMs: 42},
	}
	if diff := cmp.Diff(want, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&ExecResult{PID: 7, ExitCode: 3, DurationMs: 42}, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
}

func TestExecStreamEnds(t *testing.T) {
	tests := []struct {
		name    string
		events  [][2]string
		wantErr func(error) bool
	}{
		{"error event", [][2]string{{"start", `{"pid":1}`}, {"error", `{"code":"unavailable","message":"agent gone"}`}},
			func(err error) bool {
				var e *Error
				return errors.As(err, &e) && e.Code == "unavailable" && e.Message == "agent gone"
			}},
		{"nested error event", [][2]string{{"error", `{"error":{"code":"internal","message":"boom"}}`}},
			func(err error) bool {
				var e *Error
				return errors.As(err, &e) && e.Code == "internal" && e.Message == "boom"
			}},
		{"stream cut before exit", [][2]string{{"start", `{"pid":1}`}, {"stdout", `{"data":"x"}`}},
			func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{"bad event JSON", [][2]string{{"exit", `{"exit_code":`}},
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "decode exit event") }},
		{"bad base64", [][2]string{{"stdout", `{"data_b64":"!!"}`}},
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "data_b64") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s := startSSE(w)
				for _, ev := range tt.events {
					s.send(ev[0], ev[1])
				}
			}))
			_, err := c.ExecStream(context.Background(), "sbx_1", ExecRequest{Command: "x"}, nil)
			if !tt.wantErr(err) {
				t.Errorf("ExecStream error = %v", err)
			}
		})
	}
}

func TestStreamNotEventStream(t *testing.T) {
	c := newTestClient(t, &fakeServer{status: 200, body: `{"pid":1}`})
	if _, err := c.ExecEvents(context.Background(), "sbx_1", ExecRequest{Command: "x"}); err == nil {
		t.Error("a JSON answer to an event-stream request was accepted")
	}
	c = newTestClient(t, &fakeServer{status: 404, body: `{"error":{"code":"not_found","message":"no such sandbox"}}`})
	if _, err := c.ProcessEvents(context.Background(), "sbx_1", 3); !IsNotFound(err) {
		t.Errorf("ProcessEvents on a 404 = %v, want a not-found *Error", err)
	}
}

func TestProcessEventsIteratorAndCancel(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "GET" || r.URL.Path != "/prefix/v1/sandboxes/sbx_1/processes/5/events" {
			http.Error(w, "wrong route", 400)
			return
		}
		s := startSSE(w)
		s.send("stdout", `{"data":"a"}`)
		s.send("future", `{"x":1}`)
		s.send("stdout", `{"data":"b"}`)
		<-r.Context().Done() // a live stream that never ends by itself
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.ProcessEvents(ctx, "sbx_1", 5)
	if err != nil {
		t.Fatal(err)
	}
	var types, data []string
	for ev, err := range s.All() {
		if err != nil {
			t.Fatalf("iteration: %v", err)
		}
		types = append(types, ev.Type)
		data = append(data, string(ev.Data))
		if len(types) == 3 {
			break // closes the stream; the server sees the request end
		}
	}
	if diff := cmp.Diff([]string{"stdout", "future", "stdout"}, types); diff != "" {
		t.Errorf("types (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a", "", "b"}, data); diff != "" {
		t.Errorf("data (-want +got):\n%s", diff)
	}
	if _, err := s.Next(); err == nil {
		t.Error("Next after break succeeded")
	}
}

func TestCloseUnblocksNext(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		startSSE(w)
		<-r.Context().Done()
	}))
	s, err := c.Events(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Next()
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	s.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Next returned no error after Close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Next still blocked after Close")
	}
}

func TestEventsAndWatch(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := startSSE(w)
		switch r.URL.Path {
		case "/prefix/v1/events":
			s.send("sandbox.created", `{"sandbox_id":"sbx_1"}`)
			s.send("sandbox.deleted", `{"sandbox_id":"sbx_1"}`)
		case "/prefix/v1/sandboxes/sbx_1/fs/watch":
			if r.URL.RawQuery != "path=%2Fw&recursive=true" {
				s.send("change", `{"path":"wrong query `+r.URL.RawQuery+`","op":"x"}`)
				return
			}
			s.send("change", `{"path":"/w/a","op":"create"}`)
			s.send("other", `{}`)
			s.send("change", `{"path":"/w/a","op":"write"}`)
		}
	}))
	ctx := context.Background()
	es, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	for ev, err := range es.All() {
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	wantEvs := []Event{
		{Type: "sandbox.created", Data: json.RawMessage(`{"sandbox_id":"sbx_1"}`)},
		{Type: "sandbox.deleted", Data: json.RawMessage(`{"sandbox_id":"sbx_1"}`)},
	}
	if diff := cmp.Diff(wantEvs, evs); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	ws, err := c.WatchDir(ctx, "sbx_1", "/w", true)
	if err != nil {
		t.Fatal(err)
	}
	var changes []FileChange
	for ch, err := range ws.All() {
		if err != nil {
			t.Fatal(err)
		}
		changes = append(changes, ch)
	}
	wantChanges := []FileChange{{Path: "/w/a", Op: "create"}, {Path: "/w/a", Op: "write"}}
	if diff := cmp.Diff(wantChanges, changes); diff != "" {
		t.Errorf("changes (-want +got):\n%s", diff)
	}
}

// TestUploadStreams proves the upload is streamed: the server receives the first chunk while
// the client has not yet produced the second.
func TestUploadStreams(t *testing.T) {
	firstSeen := make(chan struct{})
	var total int64
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 4)
		if _, err := io.ReadFull(r.Body, buf); err != nil || string(buf) != "AAAA" {
			http.Error(w, fmt.Sprintf("first chunk %q: %v", buf, err), 400)
			return
		}
		close(firstSeen)
		n, _ := io.Copy(io.Discard, r.Body)
		total = 4 + n
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"path":%q,"size":%d}`, r.URL.Query().Get("path"), total)
	}))
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("AAAA"))
		select {
		case <-firstSeen:
		case <-time.After(10 * time.Second):
			pw.CloseWithError(errors.New("server did not see the first chunk before the end of the body"))
			return
		}
		chunk := bytes.Repeat([]byte("B"), 1<<20)
		for range 8 {
			pw.Write(chunk)
		}
		pw.Close()
	}()
	res, err := c.Upload(context.Background(), "sbx_1", "/big", pr, nil)
	if err != nil {
		t.Fatalf("Upload: %v", err)
	}
	if want := int64(4 + 8<<20); res.Size != want || res.Path != "/big" {
		t.Errorf("Upload = %+v, want size %d", res, want)
	}
}

// TestDownloadStreams proves the download is streamed: the client reads the first chunk while
// the server has not yet written the rest.
func TestDownloadStreams(t *testing.T) {
	release := make(chan struct{})
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") != "/f" {
			http.Error(w, `{"error":{"code":"not_found","message":"no file"}}`, 404)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		io.WriteString(w, "head")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "tail")
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := c.Download(ctx, "sbx_1", "/f")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(rc, buf); err != nil || string(buf) != "head" {
		t.Fatalf("first bytes %q: %v", buf, err)
	}
	close(release)
	rest, err := io.ReadAll(rc)
	if err != nil || string(rest) != "tail" {
		t.Errorf("rest %q: %v", rest, err)
	}
	if _, err := c.Download(ctx, "sbx_1", "/missing"); !IsNotFound(err) {
		t.Errorf("Download of a missing file = %v, want not found", err)
	}
}

func TestFileModeAndArgvDecoding(t *testing.T) {
	tests := []struct {
		in      string
		want    FileMode
		wantErr bool
	}{
		{`420`, 0o644, false}, {`"0644"`, 0o644, false}, {`"755"`, 0o755, false}, {`"0o700"`, 0o700, false},
		{`"rwx"`, 0, true}, {`true`, 0, true},
	}
	for _, tt := range tests {
		var m FileMode
		err := json.Unmarshal([]byte(tt.in), &m)
		if (err != nil) != tt.wantErr || m != tt.want {
			t.Errorf("FileMode from %s = %v, %v; want %v (error %v)", tt.in, m, err, tt.want, tt.wantErr)
		}
	}
	var a Argv
	if err := json.Unmarshal([]byte(`{"x":1}`), &a); err == nil {
		t.Error("Argv from an object succeeded")
	}
	if got := (Argv{"ls", "-l"}).String(); got != "ls -l" {
		t.Errorf("Argv.String = %q", got)
	}
}
