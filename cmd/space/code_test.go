package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/space-sandbox/space/pkg/client"
)

// pngData is what the fake's image/png result decodes to.
var pngData = []byte("\x89PNG\r\n\x1a\n")

// fakeCode stands in for spaced's code routes: a run answers with the canned events (or, for a
// JSON request, the canned result) of its sandbox.
type fakeCode struct {
	srv *httptest.Server

	mu       sync.Mutex
	events   [][2]string // SSE events of a run
	result   string      // the JSON answer of a run
	requests []string    // "METHOD path"
	bodies   map[string]string
	accept   string // of the last run
}

func newFakeCode(t *testing.T) *fakeCode {
	f := &fakeCode{bodies: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/code", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.accept = r.Header.Get("Accept")
		events, result := f.events, f.result
		f.mu.Unlock()
		if r.Header.Get("Accept") != "text/event-stream" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, result)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev[0], ev[1])
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/code/contexts", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, []client.CodeContext{
			{ID: "ctx-py", Language: "python", Cwd: "/home/user"},
			{ID: "ctx-js", Language: "javascript", Cwd: "/home/user", Restarted: true},
		})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/code/contexts", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Language, Cwd string }
		json.NewDecoder(r.Body).Decode(&req)
		writeJSON(w, 201, client.CodeContext{ID: "ctx-new", Language: req.Language, Cwd: req.Cwd})
	})
	contextOp := func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("ctx") == "nope" {
			writeError(w, 404, "not_found", "code interpreter: context nope not found")
			return
		}
		w.WriteHeader(204)
	}
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/code/contexts/{ctx}", contextOp)
	mux.HandleFunc("POST /v1/sandboxes/{id}/code/contexts/{ctx}/restart", contextOp)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.EscapedPath())
		f.bodies[r.Method+" "+r.URL.EscapedPath()] = string(b)
		f.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			writeError(w, 401, "unauthenticated", "missing or unknown API key")
			return
		}
		if strings.HasPrefix(r.URL.Path, "/v1/sandboxes/sbx_base/") {
			writeError(w, 409, "conflict", "sandbox sbx_base (template base) runs no code interpreter: create it from template code-interpreter")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeCode) cli(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	a := &app{
		ctx: context.Background(), stdin: strings.NewReader(stdin), stdout: &stdout, stderr: &stderr,
		getenv: envMap{"SPACE_URL": f.srv.URL, "SPACE_API_KEY": testKey}.get,
	}
	code := a.main(args)
	return code, stdout.String(), stderr.String()
}

func (f *fakeCode) body(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[key]
}

func (f *fakeCode) sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

func TestParseRunCode(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sh, py, txt, empty := write("job.sh", "echo hi\n"), write("Job.PY", "1+1\n"), write("notes.txt", "2*3"), write("empty.py", " \n")
	tests := []struct {
		name    string
		args    []string
		stdin   string
		want    runCodeArgs
		wantErr string // a usage error containing this
	}{
		{"-c with every flag", []string{"sbx_a", "-c", "x = 1", "--language", "javascript", "--timeout", "2.5", "--env", "A=1", "--out", "/tmp/o"}, "",
			runCodeArgs{id: "sbx_a", out: "/tmp/o", req: client.RunCodeRequest{Code: "x = 1", Language: "javascript", TimeoutSeconds: 2.5, Env: map[string]string{"A": "1"}}}, ""},
		{"flags before the ID", []string{"--context", "ctx-1", "-c", "x", "sbx_a"}, "",
			runCodeArgs{id: "sbx_a", out: ".", req: client.RunCodeRequest{Code: "x", ContextID: "ctx-1"}}, ""},
		{"a file's extension tells its language", []string{"sbx_a", sh}, "",
			runCodeArgs{id: "sbx_a", out: ".", req: client.RunCodeRequest{Code: "echo hi\n", Language: "bash"}}, ""},
		{"in upper case too", []string{"sbx_a", py}, "",
			runCodeArgs{id: "sbx_a", out: ".", req: client.RunCodeRequest{Code: "1+1\n", Language: "python"}}, ""},
		{"an unknown extension leaves the server's default", []string{"sbx_a", txt}, "",
			runCodeArgs{id: "sbx_a", out: ".", req: client.RunCodeRequest{Code: "2*3"}}, ""},
		{"--language wins over the extension", []string{"sbx_a", "--language", "python", sh}, "",
			runCodeArgs{id: "sbx_a", out: ".", req: client.RunCodeRequest{Code: "echo hi\n", Language: "python"}}, ""},
		{"a context keeps its language", []string{"sbx_a", "--context", "c", sh}, "",
			runCodeArgs{id: "sbx_a", out: ".", req: client.RunCodeRequest{Code: "echo hi\n", ContextID: "c"}}, ""},
		{"standard input", []string{"sbx_a", "-"}, "print(1)\n",
			runCodeArgs{id: "sbx_a", out: ".", req: client.RunCodeRequest{Code: "print(1)\n"}}, ""},
		{"no ID", nil, "", runCodeArgs{}, "needs a sandbox ID"},
		{"no code", []string{"sbx_a"}, "", runCodeArgs{}, "needs code"},
		{"-c and a file", []string{"sbx_a", "-c", "x", sh}, "", runCodeArgs{}, "not both"},
		{"two files", []string{"sbx_a", sh, py}, "", runCodeArgs{}, "one FILE"},
		{"language and context", []string{"sbx_a", "-c", "x", "--language", "python", "--context", "c"}, "", runCodeArgs{}, "--language or --context"},
		{"negative timeout", []string{"sbx_a", "-c", "x", "--timeout", "-1"}, "", runCodeArgs{}, "must not be negative"},
		{"empty -c", []string{"sbx_a", "-c", ""}, "", runCodeArgs{}, "the code is empty"},
		{"blank file", []string{"sbx_a", empty}, "", runCodeArgs{}, "the code is empty"},
		{"empty standard input", []string{"sbx_a", "-"}, "", runCodeArgs{}, "the code is empty"},
		{"bad env", []string{"sbx_a", "-c", "x", "--env", "NOEQUALS"}, "", runCodeArgs{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			a := &app{ctx: context.Background(), stdin: strings.NewReader(tt.stdin), stdout: io.Discard, stderr: &stderr}
			got, err := a.parseRunCode(tt.args)
			var ue *usageError
			switch {
			case tt.wantErr == "" && tt.want.id == "": // the flag package's own error
				if !errors.Is(err, errFlagParse) {
					t.Fatalf("error = %v, want a flag error", err)
				}
			case tt.wantErr != "":
				if !errors.As(err, &ue) || !strings.Contains(ue.msg, tt.wantErr) {
					t.Fatalf("error = %v, want a usage error with %q", err, tt.wantErr)
				}
			case err != nil:
				t.Fatalf("parseRunCode: %v", err)
			default:
				if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(runCodeArgs{})); diff != "" {
					t.Errorf("parsed (-want +got):\n%s", diff)
				}
			}
		})
	}
	// A file that cannot be read is not a usage error.
	a := &app{ctx: context.Background(), stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	if _, err := a.parseRunCode([]string{"sbx_a", filepath.Join(dir, "missing.py")}); err == nil || errors.As(err, new(*usageError)) {
		t.Errorf("missing file: error = %v, want a read error", err)
	}
}

func rawData(kv ...string) map[string]json.RawMessage {
	m := map[string]json.RawMessage{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = json.RawMessage(kv[i+1])
	}
	return m
}

func TestResultFiles(t *testing.T) {
	r := client.CodeResult{Data: rawData(
		"text/plain", `"<Figure>"`,
		"image/png", `"iVBORw0K\nGgo="`,
		"image/jpeg", `"/9j/"`,
		"image/svg+xml", `"<svg/>"`,
		"application/pdf", `"JVBERg=="`,
		"text/html", `"<b>x</b>"`,
		"application/json", `{"a":1}`,
	)}
	got := resultFiles(3, r)
	want := []resultFile{
		{name: "result-3.png", mime: "image/png", data: pngData},
		{name: "result-3.jpg", mime: "image/jpeg", data: []byte("\xff\xd8\xff")},
		{name: "result-3.svg", mime: "image/svg+xml", data: []byte("<svg/>")},
		{name: "result-3.pdf", mime: "application/pdf", data: []byte("%PDF")},
		{name: "result-3.html", mime: "text/html", data: []byte("<b>x</b>")},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(resultFile{})); diff != "" {
		t.Errorf("resultFiles (-want +got):\n%s", diff)
	}
	// Text alone, or an image that is not base64, makes no file.
	if got := resultFiles(1, client.CodeResult{Data: rawData("text/plain", `"1"`, "image/png", `"!!"`)}); len(got) != 0 {
		t.Errorf("resultFiles of text and a bad image = %+v", got)
	}
	for _, tt := range []struct {
		data     map[string]json.RawMessage
		want     string
		wantText bool
	}{
		{rawData("text/plain", `"42"`, "application/json", `42`), "42", true},
		{rawData("application/json", `{"a": [1]}`), `{"a": [1]}`, true},
		{rawData("text/html", `"<p>"`), "", false},
	} {
		if got, ok := resultText(client.CodeResult{Data: tt.data}); got != tt.want || ok != tt.wantText {
			t.Errorf("resultText(%v) = %q, %v; want %q, %v", tt.data, got, ok, tt.want, tt.wantText)
		}
	}
}

func TestRunCode(t *testing.T) {
	png := `"iVBORw0KGgo="` // pngData
	tests := []struct {
		name     string
		args     []string
		events   [][2]string
		result   string // for --json
		wantCode int
		wantOut  string
		wantErr  string // stderr, with DIR for the --out directory
		wantBody string
		files    map[string]string // in DIR
	}{
		{
			name: "output, text, images and html",
			args: []string{"run-code", "sbx_a", "--out", "DIR", "-c", "plot()"},
			events: [][2]string{
				{"stdout", `{"text":"drawing\n"}`},
				{"stderr", `{"text":"careful\n"}`},
				{"result", `{"is_main_result":false,"data":{"text/plain":"<Figure size 640x480>","image/png":` + png + `}}`},
				{"result", `{"is_main_result":false,"data":{"text/plain":"shown"}}`},
				{"result", `{"is_main_result":false,"data":{"text/html":"<table></table>"}}`},
				{"result", `{"is_main_result":false,"data":{"text/markdown":"# hi"}}`},
				{"result", `{"is_main_result":true,"data":{"text/plain":"   a\n0  1","text/html":"<table>1</table>"}}`},
				{"end", `{"execution_count":4}`},
			},
			wantOut: "drawing\nshown\n   a\n0  1\n",
			wantErr: "careful\n" +
				"space: result 1 (image/png) saved to DIR/result-1.png\n" +
				"space: result 3 (text/html) saved to DIR/result-3.html\n" +
				"space: result 4 has nothing to show here (text/markdown); --json shows it\n" +
				"space: result 5 (text/html) saved to DIR/result-5.html\n",
			wantBody: `{"code":"plot()"}`,
			files:    map[string]string{"result-1.png": string(pngData), "result-3.html": "<table></table>", "result-5.html": "<table>1</table>"},
		},
		{
			name: "an exception prints its traceback and exits 1",
			args: []string{"run-code", "sbx_a", "--language", "python", "-c", "1/0"},
			events: [][2]string{
				{"kernel_restarted", `{"reason":"the sandbox was restored from a filesystem snapshot"}`},
				{"stdout", `{"text":"before\n"}`},
				{"error", `{"name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback (most recent call last):\nZeroDivisionError: division by zero"}`},
				{"end", `{"execution_count":2}`},
			},
			wantCode: 1, wantOut: "before\n",
			wantErr: "space: the kernel was restarted before this run (the sandbox was restored from a filesystem snapshot): earlier state is gone\n" +
				"Traceback (most recent call last):\nZeroDivisionError: division by zero\n",
			wantBody: `{"code":"1/0","language":"python"}`,
		},
		{
			name:     "an error without a traceback prints its name",
			args:     []string{"run-code", "sbx_a", "-c", "sleep()", "--timeout", "1"},
			events:   [][2]string{{"error", `{"name":"TimeoutError","value":"the cell ran past 1 s","traceback":""}`}, {"end", `{"execution_count":3}`}},
			wantCode: 1, wantErr: "TimeoutError: the cell ran past 1 s\n",
			wantBody: `{"code":"sleep()","timeout_seconds":1}`,
		},
		{
			name:     "a run that could not finish",
			args:     []string{"run-code", "sbx_a", "-c", "x"},
			events:   [][2]string{{"stdout", `{"text":"partial"}`}, {"end", `{"error":{"code":"unavailable","message":"sandbox sbx_a is deleting"}}`}},
			wantCode: 1, wantOut: "partial", wantErr: "space: sandbox sbx_a is deleting\n",
		},
		{
			name:     "a sandbox without a code interpreter",
			args:     []string{"run-code", "sbx_base", "-c", "x"},
			wantCode: 1, wantErr: "space: sandbox sbx_base (template base) runs no code interpreter: create it from template code-interpreter\n",
		},
		{
			name:     "json",
			args:     []string{"--json", "run-code", "sbx_a", "-c", "1/0", "--context", "ctx-py"},
			result:   `{"results":[],"stdout":"","stderr":"","error":{"name":"ZeroDivisionError","value":"division by zero","traceback":"tb"},"execution_count":1}`,
			wantCode: 1,
			wantOut: "{\n  \"results\": [],\n  \"stdout\": \"\",\n  \"stderr\": \"\",\n  \"error\": {\n    \"name\": \"ZeroDivisionError\",\n" +
				"    \"value\": \"division by zero\",\n    \"traceback\": \"tb\"\n  },\n  \"execution_count\": 1\n}\n",
			wantBody: `{"code":"1/0","context_id":"ctx-py"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeCode(t)
			f.events, f.result = tt.events, tt.result
			dir := filepath.Join(t.TempDir(), "out")
			args := make([]string, len(tt.args))
			for i, a := range tt.args {
				args[i] = strings.ReplaceAll(a, "DIR", dir)
			}
			code, out, errOut := f.cli(t, "", args...)
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.wantCode, errOut)
			}
			if out != tt.wantOut {
				t.Errorf("stdout = %q, want %q", out, tt.wantOut)
			}
			if want := strings.ReplaceAll(tt.wantErr, "DIR", dir); errOut != want {
				t.Errorf("stderr = %q, want %q", errOut, want)
			}
			if tt.wantBody != "" {
				jsonEqual(t, tt.wantBody, f.body("POST /v1/sandboxes/"+args[idIndex(args)]+"/code"))
			}
			for name, want := range tt.files {
				got, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil || string(got) != want {
					t.Errorf("%s = %q (%v), want %q", name, got, err, want)
				}
			}
			if tt.files == nil {
				if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("--out directory made without files for it: %v", err)
				}
			}
		})
	}
}

// idIndex is the index of the sandbox ID in a run-code command line of these tests.
func idIndex(args []string) int {
	for i, a := range args {
		if strings.HasPrefix(a, "sbx_") {
			return i
		}
	}
	return 0
}

// TestRunCodeSavesInTheCurrentDirectory: without --out, result files go to the working
// directory under their plain names.
func TestRunCodeSavesInTheCurrentDirectory(t *testing.T) {
	f := newFakeCode(t)
	f.events = [][2]string{{"result", `{"is_main_result":true,"data":{"image/svg+xml":"<svg/>"}}`}, {"end", `{"execution_count":1}`}}
	t.Chdir(t.TempDir())
	code, out, errOut := f.cli(t, "", "run-code", "sbx_a", "-c", "draw()")
	if code != 0 || out != "" || errOut != "space: result 1 (image/svg+xml) saved to result-1.svg\n" {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if b, err := os.ReadFile("result-1.svg"); err != nil || string(b) != "<svg/>" {
		t.Errorf("result-1.svg = %q, %v", b, err)
	}
	// A result that cannot be saved is reported, and the run exits 1 when done.
	if err := os.Mkdir("blocked", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join("blocked", "result-1.svg"), 0o755); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = f.cli(t, "", "run-code", "sbx_a", "--out", "blocked", "-c", "draw()")
	if code != 1 || !strings.HasPrefix(errOut, "space: result 1 (image/svg+xml): ") {
		t.Errorf("unsavable result: exit %d, stderr %q", code, errOut)
	}
}

func TestCodeContexts(t *testing.T) {
	f := newFakeCode(t)
	code, out, errOut := f.cli(t, "", "code-contexts", "sbx_a")
	want := "" +
		"ID      LANGUAGE    CWD         RESTARTED\n" +
		"ctx-py  python      /home/user  -\n" +
		"ctx-js  javascript  /home/user  yes\n"
	if code != 0 || out != want {
		t.Errorf("ls: exit %d, stderr %q, stdout:\n%s\nwant:\n%s", code, errOut, out, want)
	}
	code, out, _ = f.cli(t, "", "--json", "code-contexts", "sbx_a", "ls")
	var list []client.CodeContext
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list) != 2 || !list[1].Restarted {
		t.Errorf("ls --json: exit %d, %v, %q", code, err, out)
	}

	code, out, _ = f.cli(t, "", "code-contexts", "sbx_a", "create", "--language", "bash", "--cwd", "/tmp")
	if code != 0 || out != "ctx-new\n" {
		t.Errorf("create: exit %d, stdout %q", code, out)
	}
	jsonEqual(t, `{"language":"bash","cwd":"/tmp"}`, f.body("POST /v1/sandboxes/sbx_a/code/contexts"))
	f.cli(t, "", "code-contexts", "sbx_a", "create")
	jsonEqual(t, `{}`, f.body("POST /v1/sandboxes/sbx_a/code/contexts"))

	code, out, _ = f.cli(t, "", "code-contexts", "sbx_a", "rm", "c1", "c/2")
	if code != 0 || out != "c1\nc/2\n" {
		t.Errorf("rm: exit %d, stdout %q", code, out)
	}
	code, out, _ = f.cli(t, "", "code-contexts", "sbx_a", "restart", "c1")
	if code != 0 || out != "c1\n" {
		t.Errorf("restart: exit %d, stdout %q", code, out)
	}
	reqs := f.sent()
	wantReqs := []string{
		"DELETE /v1/sandboxes/sbx_a/code/contexts/c1", "DELETE /v1/sandboxes/sbx_a/code/contexts/c%2F2",
		"POST /v1/sandboxes/sbx_a/code/contexts/c1/restart",
	}
	if diff := cmp.Diff(wantReqs, reqs[len(reqs)-3:]); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	code, _, errOut = f.cli(t, "", "code-contexts", "sbx_a", "rm", "nope")
	if code != 1 || errOut != "space: code interpreter: context nope not found\n" {
		t.Errorf("rm of an unknown context: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = f.cli(t, "", "code-contexts", "sbx_base")
	if code != 1 || !strings.Contains(errOut, "runs no code interpreter") {
		t.Errorf("ls of a sandbox without a code interpreter: exit %d, stderr %q", code, errOut)
	}
}

func TestCodeUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"run-code"}, "run-code needs a sandbox ID"},
		{[]string{"run-code", "sbx_a"}, "run-code needs code"},
		{[]string{"run-code", "sbx_a", "--bogus", "-c", "x"}, "flag provided but not defined: -bogus"},
		{[]string{"code-contexts"}, "usage: space code-contexts ID"},
		{[]string{"code-contexts", "sbx_a", "frob"}, "usage: space code-contexts ID"},
		{[]string{"code-contexts", "sbx_a", "rm"}, "usage: space code-contexts ID"},
		{[]string{"code-contexts", "sbx_a", "ls", "x"}, "usage: space code-contexts ID"},
		{[]string{"code-contexts", "sbx_a", "restart"}, "usage: space code-contexts ID"},
		{[]string{"code-contexts", "sbx_a", "ls", "--language", "python"}, "go with create"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			f := newFakeCode(t)
			code, _, errOut := f.cli(t, "", tt.args...)
			if code != 2 || !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errOut, tt.wantErr)
			}
			if reqs := f.sent(); len(reqs) != 0 {
				t.Errorf("a usage error still sent %v", reqs)
			}
		})
	}
	// Both commands are in the usage.
	f := newFakeCode(t)
	_, out, _ := f.cli(t, "", "help")
	for _, want := range []string{"  run-code ", "(-c CODE | FILE | -)", "  code-contexts ", "restart CTX..."} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
}
