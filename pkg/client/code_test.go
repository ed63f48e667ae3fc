package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A 1x1 PNG, and its base64 as Jupyter sends it (with a line break).
var (
	pngBytes = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	pngB64   = "iVBORw0KGgoAAAAN\nSUhEUg=="
)

func TestCodeRequests(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		status   int
		respBody string
		call     func(c *Client) (any, error)
		want     recorded
		wantBody string
		wantOut  any
	}{
		{
			name: "run code", status: 200,
			respBody: `{"results":[{"is_main_result":true,"data":{"text/plain":"42"}}],"stdout":"hi\n","stderr":"",
				"error":null,"execution_count":3}`,
			call: func(c *Client) (any, error) {
				return c.RunCode(ctx, "sbx_1", RunCodeRequest{Code: "print('hi')\n6*7", Language: "python", Env: map[string]string{"A": "b"}, TimeoutSeconds: 2.5})
			},
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/code", Accept: "application/json", CT: "application/json"},
			wantBody: `{"code":"print('hi')\n6*7","language":"python","env":{"A":"b"},"timeout_seconds":2.5}`,
			wantOut: &CodeExecution{Results: []CodeResult{{IsMain: true, Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"42"`)}}},
				Stdout: "hi\n", ExecutionCount: 3},
		},
		{
			name: "run code in a context, with an exception and a restarted kernel", status: 200,
			respBody: `{"results":[],"stdout":"","stderr":"","error":{"name":"NameError","value":"name 'x' is not defined","traceback":"Traceback...\nNameError"},
				"execution_count":1,"kernel_restarted":"restored from a filesystem snapshot"}`,
			call: func(c *Client) (any, error) {
				return c.RunCode(ctx, "sbx_1", RunCodeRequest{Code: "x", ContextID: "c1"})
			},
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/code"},
			wantBody: `{"code":"x","context_id":"c1"}`,
			wantOut: &CodeExecution{Results: []CodeResult{}, ExecutionCount: 1, KernelRestarted: "restored from a filesystem snapshot",
				Error: &CodeError{Name: "NameError", Value: "name 'x' is not defined", Traceback: "Traceback...\nNameError"}},
		},
		{
			name: "list contexts", status: 200,
			respBody: `[{"id":"py","language":"python","cwd":"/home/user"},{"id":"js","language":"javascript","cwd":"/home/user","restarted":true}]`,
			call:     func(c *Client) (any, error) { return c.ListCodeContexts(ctx, "sbx_1") },
			want:     recorded{Method: "GET", Path: "/prefix/v1/sandboxes/sbx_1/code/contexts"},
			wantOut: []CodeContext{{ID: "py", Language: "python", Cwd: "/home/user"},
				{ID: "js", Language: "javascript", Cwd: "/home/user", Restarted: true}},
		},
		{
			name: "create context", status: 201, respBody: `{"id":"c2","language":"bash","cwd":"/tmp"}`,
			call:     func(c *Client) (any, error) { return c.CreateCodeContext(ctx, "sbx_1", "bash", "/tmp") },
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/code/contexts", CT: "application/json"},
			wantBody: `{"language":"bash","cwd":"/tmp"}`,
			wantOut:  &CodeContext{ID: "c2", Language: "bash", Cwd: "/tmp"},
		},
		{
			name: "create context with the defaults sends an empty object", status: 201, respBody: `{"id":"c3","language":"python","cwd":"/home/user"}`,
			call:     func(c *Client) (any, error) { return c.CreateCodeContext(ctx, "sbx_1", "", "") },
			want:     recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/code/contexts"},
			wantBody: `{}`,
			wantOut:  &CodeContext{ID: "c3", Language: "python", Cwd: "/home/user"},
		},
		{
			name: "delete context escapes its id", status: 204,
			call:    func(c *Client) (any, error) { return nil, c.DeleteCodeContext(ctx, "sbx_1", "a/b c") },
			want:    recorded{Method: "DELETE", Path: "/prefix/v1/sandboxes/sbx_1/code/contexts/a%2Fb%20c"},
			wantOut: nil,
		},
		{
			name: "restart context", status: 204,
			call:    func(c *Client) (any, error) { return nil, c.RestartCodeContext(ctx, "sbx_1", "c1") },
			want:    recorded{Method: "POST", Path: "/prefix/v1/sandboxes/sbx_1/code/contexts/c1/restart"},
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
			} else if got.Body != "" {
				t.Errorf("body = %q, want none", got.Body)
			}
			if diff := cmp.Diff(tt.wantOut, derefNil(out)); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCodeErrors(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   *Error
		check  func(error) bool
	}{
		{"no code interpreter", 409, `{"error":{"code":"conflict","message":"sandbox sbx_1 (template base) runs no code interpreter: create it from template code-interpreter"}}`,
			&Error{Status: 409, Code: "conflict", Message: "sandbox sbx_1 (template base) runs no code interpreter: create it from template code-interpreter"}, IsConflict},
		{"unknown context", 404, `{"error":{"code":"not_found","message":"code interpreter: context c9 not found"}}`,
			&Error{Status: 404, Code: "not_found", Message: "code interpreter: context c9 not found"}, IsNotFound},
		{"code too large", 413, `{"error":{"code":"too_large","message":"code: 2000000 bytes; the limit is 1048576"}}`,
			&Error{Status: 413, Code: "too_large", Message: "code: 2000000 bytes; the limit is 1048576"}, nil},
		{"interpreter not answering", 503, `{"error":{"code":"unavailable","message":"the sandbox's code interpreter does not answer"}}`,
			&Error{Status: 503, Code: "unavailable", Message: "the sandbox's code interpreter does not answer"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, &fakeServer{status: tt.status, body: tt.body})
			ctx := context.Background()
			for name, call := range map[string]func() error{
				"RunCode": func() error { _, err := c.RunCode(ctx, "sbx_1", RunCodeRequest{Code: "1"}); return err },
				"RunCodeStream": func() error {
					_, err := c.RunCodeStream(ctx, "sbx_1", RunCodeRequest{Code: "1"}, nil)
					return err
				},
				"ListCodeContexts":   func() error { _, err := c.ListCodeContexts(ctx, "sbx_1"); return err },
				"CreateCodeContext":  func() error { _, err := c.CreateCodeContext(ctx, "sbx_1", "", ""); return err },
				"DeleteCodeContext":  func() error { return c.DeleteCodeContext(ctx, "sbx_1", "c9") },
				"RestartCodeContext": func() error { return c.RestartCodeContext(ctx, "sbx_1", "c9") },
			} {
				err := call()
				var got *Error
				if !errors.As(err, &got) {
					t.Fatalf("%s: error = %v (%T), want *Error", name, err, err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("%s: error (-want +got):\n%s", name, diff)
				}
				if tt.check != nil && !tt.check(err) {
					t.Errorf("%s: the error's class is not recognised: %v", name, err)
				}
			}
		})
	}
}

func TestRunCodeStreamAssembles(t *testing.T) {
	release := make(chan struct{})
	var gotReq recorded
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotReq = recorded{Method: r.Method, Path: r.URL.Path, Accept: r.Header.Get("Accept"), Body: string(b)}
		s := startSSE(w)
		s.send("kernel_restarted", `{"reason":"restored from a filesystem snapshot"}`)
		s.send("stdout", `{"text":"step 1\n"}`)
		// The rest waits until the client has seen the first output: events arrive live.
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, ": keepalive\n\n")
		s.send("stderr", `{"text":"warn\n"}`)
		s.send("stdout", `{"text":"step 2\n"}`)
		s.send("result", `{"is_main_result":false,"data":{"text/plain":"<Figure>","image/png":"`+strings.ReplaceAll(pngB64, "\n", `\n`)+`"}}`)
		s.send("future", `{"x":1}`)
		s.send("result", `{"is_main_result":true,"data":{"text/plain":"{'a': 1}","application/json":{"a":1},"text/html":"<b>1</b>"}}`)
		s.send("error", `{"name":"ValueError","value":"late","traceback":"tb"}`)
		s.send("end", `{"execution_count":7}`)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var types []string
	exec, err := c.RunCodeStream(ctx, "sbx_1", RunCodeRequest{Code: "run()", Language: "python"}, func(ev CodeEvent) error {
		types = append(types, ev.Type)
		if ev.Type == CodeEventStdout && ev.Text == "step 1\n" {
			close(release)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("RunCodeStream: %v", err)
	}
	if gotReq.Accept != "text/event-stream" || gotReq.Method != "POST" || gotReq.Path != "/prefix/v1/sandboxes/sbx_1/code" {
		t.Errorf("request = %+v", gotReq)
	}
	jsonEq(t, `{"code":"run()","language":"python"}`, gotReq.Body)
	wantTypes := []string{"kernel_restarted", "stdout", "stderr", "stdout", "result", "future", "result", "error", "end"}
	if diff := cmp.Diff(wantTypes, types); diff != "" {
		t.Errorf("event types (-want +got):\n%s", diff)
	}
	if exec.Stdout != "step 1\nstep 2\n" || exec.Stderr != "warn\n" || exec.ExecutionCount != 7 ||
		exec.KernelRestarted != "restored from a filesystem snapshot" || len(exec.Results) != 2 {
		t.Errorf("execution = %+v", exec)
	}
	if diff := cmp.Diff(&CodeError{Name: "ValueError", Value: "late", Traceback: "tb"}, exec.Error); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	if got := exec.Text(); got != "{'a': 1}" {
		t.Errorf("Text() = %q", got)
	}
	if got, ok := exec.Results[0].PNG(); !ok || string(got) != string(pngBytes) {
		t.Errorf("PNG() = %q, %v; want %q", got, ok, pngBytes)
	}
	if _, ok := exec.Results[0].HTML(); ok {
		t.Error("HTML() of a result without text/html succeeded")
	}
	if got, ok := exec.Results[1].HTML(); !ok || got != "<b>1</b>" {
		t.Errorf("HTML() = %q, %v", got, ok)
	}
	var v map[string]int
	if raw, ok := exec.Results[1].JSON(); !ok || json.Unmarshal(raw, &v) != nil || v["a"] != 1 {
		t.Errorf("JSON() = %s, %v", raw, ok)
	}
	if diff := cmp.Diff([]string{"application/json", "text/html", "text/plain"}, exec.Results[1].MIMETypes()); diff != "" {
		t.Errorf("MIMETypes (-want +got):\n%s", diff)
	}
	if got := exec.Error.Error(); got != "ValueError: late" {
		t.Errorf("CodeError.Error() = %q", got)
	}
}

func TestRunCodeStreamEnds(t *testing.T) {
	fnErr := errors.New("stop here")
	tests := []struct {
		name    string
		events  [][2]string
		fn      func(CodeEvent) error
		wantErr func(error) bool
	}{
		{"end with error", [][2]string{{"stdout", `{"text":"x"}`}, {"end", `{"error":{"code":"unavailable","message":"sandbox sbx_1 is deleting"}}`}}, nil,
			func(err error) bool {
				var e *Error
				return errors.As(err, &e) && *e == Error{Status: 503, Code: "unavailable", Message: "sandbox sbx_1 is deleting"}
			}},
		{"end with error naming a status", [][2]string{{"end", `{"error":{"code":503,"message":"unavailable"}}`}}, nil,
			func(err error) bool {
				var e *Error
				return errors.As(err, &e) && *e == Error{Status: 503, Code: "unavailable", Message: "unavailable"}
			}},
		{"end with an empty error", [][2]string{{"end", `{"error":{}}`}}, nil,
			func(err error) bool {
				var e *Error
				return errors.As(err, &e) && e.Status == 500 && e.Message == "the run could not finish"
			}},
		{"stream cut before end", [][2]string{{"stdout", `{"text":"x"}`}}, nil,
			func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{"bad event JSON", [][2]string{{"result", `{"data":`}}, nil,
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "decode result event") }},
		{"fn stops the run", [][2]string{{"stdout", `{"text":"x"}`}, {"end", `{"execution_count":1}`}},
			func(CodeEvent) error { return fnErr },
			func(err error) bool { return errors.Is(err, fnErr) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s := startSSE(w)
				for _, ev := range tt.events {
					s.send(ev[0], ev[1])
				}
			}))
			exec, err := c.RunCodeStream(context.Background(), "sbx_1", RunCodeRequest{Code: "x"}, tt.fn)
			if !tt.wantErr(err) {
				t.Errorf("RunCodeStream error = %v", err)
			}
			if exec != nil {
				t.Errorf("RunCodeStream returned an execution with the error: %+v", exec)
			}
		})
	}
}

// TestRunCodeEvents reads the stream by hand: an end with an error arrives as an event with Err.
func TestRunCodeEvents(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := startSSE(w)
		s.send("stdout", `{"text":"a"}`)
		s.send("end", `{"error":{"code":"not_found","message":"sandbox sbx_1 not found"}}`)
	}))
	s, err := c.RunCodeEvents(context.Background(), "sbx_1", RunCodeRequest{Code: "x"})
	if err != nil {
		t.Fatal(err)
	}
	var evs []CodeEvent
	for ev, err := range s.All() {
		if err != nil {
			t.Fatal(err)
		}
		ev.Raw = nil
		evs = append(evs, ev)
	}
	want := []CodeEvent{
		{Type: "stdout", Text: "a"},
		{Type: "end", Err: &Error{Status: 404, Code: "not_found", Message: "sandbox sbx_1 not found"}},
	}
	if diff := cmp.Diff(want, evs); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestCodeResultAccessors(t *testing.T) {
	r := CodeResult{Data: map[string]json.RawMessage{
		"text/plain": json.RawMessage(`"x"`),
		"image/png":  json.RawMessage(`"!!not base64"`),
		"image/jpeg": json.RawMessage(`"/9j/"`),
		"text/html":  json.RawMessage(`{"not":"a string"}`),
	}}
	if r.Text() != "x" {
		t.Errorf("Text() = %q", r.Text())
	}
	if _, ok := r.PNG(); ok {
		t.Error("PNG() of bad base64 succeeded")
	}
	if b, ok := r.JPEG(); !ok || string(b) != "\xff\xd8\xff" {
		t.Errorf("JPEG() = %q, %v", b, ok)
	}
	if _, ok := r.HTML(); ok {
		t.Error("HTML() of a non-string succeeded")
	}
	if _, ok := r.SVG(); ok {
		t.Error("SVG() of a result without one succeeded")
	}
	if (&CodeExecution{}).Text() != "" || (&CodeExecution{Results: []CodeResult{r}}).Text() != "" {
		t.Error("Text() of an execution without a main result is not empty")
	}
	if got := (&CodeError{Name: "KeyboardInterrupt"}).Error(); got != "KeyboardInterrupt" {
		t.Errorf("CodeError.Error() = %q", got)
	}
}
