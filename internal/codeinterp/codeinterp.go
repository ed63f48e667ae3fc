// Package codeinterp is spaced's client of the code-interpreter server that runs in sandboxes of
// the code-interpreter template (internal/codeinterp/server): it runs code through the server's
// wire (E2B's: newline-delimited JSON lines, ../shared/E2B-CODE-INTERPRETER.md) and manages its
// contexts, handing results over as Jupyter MIME bundles. The API's code routes use it.
package codeinterp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
)

// MaxCode is the largest cell the server takes.
const MaxCode = 1 << 20

// maxLine bounds one line of the server's answer (an image result is one line).
const maxLine = 32 << 20

// Request is one cell to run.
type Request struct {
	Code      string            `json:"code"`
	Language  string            `json:"language,omitempty"`
	ContextID string            `json:"context_id,omitempty"`
	Env       map[string]string `json:"env_vars,omitempty"`
	// Timeout, in seconds, interrupts the cell (the kernel stays usable); 0: none.
	Timeout float64 `json:"timeout,omitempty"`
}

// Event is one thing a running cell produced, in order. Kind is stdout, stderr (Text), result
// (Result), error (Error: an exception in the code, or a timeout), kernel_restarted (Text: why;
// the kernel's state from before is gone) or end (ExecutionCount).
type Event struct {
	Size           int // bytes of the wire line it came in
	Kind           string
	Text           string
	Result         *Result
	Error          *ExecError
	ExecutionCount int
}

// Result is one rich result: a MIME bundle as Jupyter gives it ("text/plain", "image/png"
// base64, "text/html", "application/json" as JSON, ...). IsMain marks the value of the cell's
// last expression; display calls (plt.show()) give the others.
type Result struct {
	IsMain bool           `json:"is_main_result"`
	Data   map[string]any `json:"data"`
}

// ExecError is an exception the code raised (or the interruption at a timeout).
type ExecError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Context is one kernel: its own state, language and working directory.
type Context struct {
	ID        string `json:"id"`
	Language  string `json:"language"`
	Cwd       string `json:"cwd"`
	Restarted bool   `json:"restarted,omitempty"`
}

// Client talks to one sandbox's server.
type Client struct {
	URL         string // http://<sandbox>:<port>
	Transport   http.RoundTripper
	AccessToken string // the sandbox's: the server reads the sandbox's variables from its agent with it
}

// mimeOf maps a field of the wire's result lines to its MIME type (the wire flattens the
// bundle); ok is false for other fields.
func mimeOf(field string) (mime string, ok bool) {
	switch field {
	case "text":
		return "text/plain", true
	case "html":
		return "text/html", true
	case "markdown":
		return "text/markdown", true
	case "svg":
		return "image/svg+xml", true
	case "png":
		return "image/png", true
	case "jpeg":
		return "image/jpeg", true
	case "pdf":
		return "application/pdf", true
	case "latex":
		return "text/latex", true
	case "json":
		return "application/json", true
	case "javascript":
		return "application/javascript", true
	case "data":
		return "e2b/data", true
	case "chart":
		return "e2b/chart", true
	}
	return "", false
}

// Execute runs req and calls emit with each event as it arrives, ending with an end event. An
// error from emit stops the run (the server interrupts the cell when the connection goes).
func (c *Client) Execute(ctx context.Context, req Request, emit func(Event) error) error {
	if len(req.Code) > MaxCode {
		return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("code: %d bytes; the limit is %d", len(req.Code), MaxCode))
	}
	res, err := c.do(ctx, http.MethodPost, "/execute", req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	count := 0
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		ev, ok, err := parseLine(line)
		if err != nil {
			return errdefs.New(errdefs.ErrUpstream, "code interpreter: "+err.Error())
		}
		if !ok {
			continue
		}
		ev.Size = len(line)
		if ev.Kind == "count" {
			count = ev.ExecutionCount
			continue
		}
		if err := emit(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("code interpreter: the answer broke off: %v", err))
	}
	return emit(Event{Kind: "end", ExecutionCount: count})
}

// parseLine turns one wire line into an event; ok is false for lines without one (keepalive,
// end_of_execution, unknown types). The execution count comes as Kind "count".
func parseLine(line []byte) (Event, bool, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return Event{}, false, fmt.Errorf("a line that is not JSON: %.100q", line)
	}
	var typ string
	_ = json.Unmarshal(m["type"], &typ)
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(m[k], &s)
		return s
	}
	switch typ {
	case "stdout", "stderr":
		return Event{Kind: typ, Text: str("text")}, true, nil
	case "error":
		return Event{Kind: "error", Error: &ExecError{Name: str("name"), Value: str("value"), Traceback: str("traceback")}}, true, nil
	case "kernel_restarted":
		return Event{Kind: "kernel_restarted", Text: str("reason")}, true, nil
	case "number_of_executions":
		var n int
		_ = json.Unmarshal(m["execution_count"], &n)
		return Event{Kind: "count", ExecutionCount: n}, true, nil
	case "result":
		r := &Result{Data: map[string]any{}}
		_ = json.Unmarshal(m["is_main_result"], &r.IsMain)
		for k, raw := range m {
			if mime, ok := mimeOf(k); ok && string(raw) != "null" {
				var v any
				if err := json.Unmarshal(raw, &v); err == nil {
					r.Data[mime] = v
				}
			}
		}
		var extra map[string]any
		if json.Unmarshal(m["extra"], &extra) == nil {
			for k, v := range extra {
				if _, taken := r.Data[k]; !taken {
					r.Data[k] = v
				}
			}
		}
		return Event{Kind: "result", Result: r}, true, nil
	}
	return Event{}, false, nil
}

// Contexts lists the server's contexts.
func (c *Client) Contexts(ctx context.Context) ([]Context, error) {
	var out []Context
	return out, c.call(ctx, http.MethodGet, "/contexts", nil, &out)
}

// CreateContext starts a kernel for language (default python) in cwd (default the user's home).
func (c *Client) CreateContext(ctx context.Context, language, cwd string) (Context, error) {
	var out Context
	body := map[string]string{}
	if language != "" {
		body["language"] = language
	}
	if cwd != "" {
		body["cwd"] = cwd
	}
	return out, c.call(ctx, http.MethodPost, "/contexts", body, &out)
}

// DeleteContext shuts a context's kernel down.
func (c *Client) DeleteContext(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, "/contexts/"+id, nil, nil)
}

// RestartContext restarts a context's kernel: its state is gone.
func (c *Client) RestartContext(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, "/contexts/"+id+"/restart", nil, nil)
}

// checkID refuses IDs that would change the path.
func checkID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/?#%\\ \t\r\n") || id == "." || id == ".." {
		return errdefs.NotFound(fmt.Sprintf("context %q not found", id))
	}
	return nil
}

func (c *Client) call(ctx context.Context, method, path string, body, out any) error {
	res, err := c.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 8<<20)).Decode(out); err != nil {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("code interpreter: unreadable answer to %s %s: %v", method, path, err))
	}
	return nil
}

// do sends one request; a non-2xx answer becomes an error of the matching kind with the
// server's message.
func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.AccessToken != "" {
		req.Header.Set("X-Access-Token", c.AccessToken)
	}
	res, err := (&http.Client{Transport: c.Transport}).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("the sandbox's code interpreter does not answer: %v", err))
	}
	if res.StatusCode/100 == 2 {
		return res, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	res.Body.Close()
	text := strings.TrimSpace(string(msg))
	if text == "" {
		text = res.Status
	}
	kind := errdefs.ErrUnavailable
	switch res.StatusCode {
	case http.StatusBadRequest:
		kind = errdefs.ErrInvalidArgument
	case http.StatusNotFound:
		kind = errdefs.ErrNotFound
	case http.StatusRequestEntityTooLarge:
		kind = errdefs.ErrTooLarge
	case http.StatusTooManyRequests:
		kind = errdefs.ErrResourceExhausted
	}
	return nil, errdefs.New(kind, "code interpreter: "+text)
}
