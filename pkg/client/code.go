package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
)

// RunCodeRequest is the body of POST /v1/sandboxes/{id}/code: one cell for the code interpreter
// of a sandbox of template "code-interpreter". Code is required; set at most one of Language and
// ContextID (a context has its language). With neither, the cell runs in the default Python
// context.
type RunCodeRequest struct {
	Code string `json:"code"`
	// Language picks that language's default context: "python" (the default), "bash" ("sh"),
	// "javascript" ("js"; "typescript" and "ts" run there too).
	Language  string            `json:"language,omitempty"`
	ContextID string            `json:"context_id,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// TimeoutSeconds interrupts the cell after this long (the run then ends with a CodeError
	// named "TimeoutError"; the context keeps its state); 0 means the server's default, 300.
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
}

// CodeExecution is everything a cell produced. An exception in the code is Error, not an error
// of the call that ran it.
type CodeExecution struct {
	Results []CodeResult `json:"results"`
	Stdout  string       `json:"stdout"`
	Stderr  string       `json:"stderr"`
	// Error is the exception the cell raised ("TimeoutError" at its timeout, "DeadKernelError"
	// if the kernel died), or nil.
	Error *CodeError `json:"error"`
	// ExecutionCount is how many cells the context has run, this one included.
	ExecutionCount int `json:"execution_count"`
	// KernelRestarted, when set, says why the context's kernel was restarted before this cell
	// (for example, the sandbox was restored from a filesystem snapshot): earlier state is gone.
	KernelRestarted string `json:"kernel_restarted,omitempty"`
}

// Text returns the text/plain of the cell's main result (the value of its last expression), or
// "" if it has none.
func (e *CodeExecution) Text() string {
	if r := e.MainResult(); r != nil {
		return r.Text()
	}
	return ""
}

// MainResult returns the cell's main result, or nil if it has none.
func (e *CodeExecution) MainResult() *CodeResult {
	for i := range e.Results {
		if e.Results[i].IsMain {
			return &e.Results[i]
		}
	}
	return nil
}

// CodeResult is one rich result of a cell, a Jupyter MIME bundle: the value of the cell's last
// expression (IsMain) or something the code displayed (plt.show(), display(...)). Data maps each
// MIME type to its JSON value: a string for text types ("text/plain", "text/html",
// "image/svg+xml", ...), a base64 string for binary ones ("image/png", "image/jpeg",
// "application/pdf"), any JSON for "application/json".
type CodeResult struct {
	IsMain bool                       `json:"is_main_result"`
	Data   map[string]json.RawMessage `json:"data"`
}

// MIME types of code results.
const (
	MIMEText     = "text/plain"
	MIMEHTML     = "text/html"
	MIMEMarkdown = "text/markdown"
	MIMELaTeX    = "text/latex"
	MIMESVG      = "image/svg+xml"
	MIMEPNG      = "image/png"
	MIMEJPEG     = "image/jpeg"
	MIMEPDF      = "application/pdf"
	MIMEJSON     = "application/json"
	MIMEJS       = "application/javascript"
)

// Text returns the result's text/plain, or "".
func (r CodeResult) Text() string {
	s, _ := r.TextOf(MIMEText)
	return s
}

// HTML returns the result's text/html.
func (r CodeResult) HTML() (string, bool) { return r.TextOf(MIMEHTML) }

// SVG returns the result's image/svg+xml.
func (r CodeResult) SVG() (string, bool) { return r.TextOf(MIMESVG) }

// PNG returns the result's image/png, decoded; false if it has none or it is not base64.
func (r CodeResult) PNG() ([]byte, bool) { return r.BytesOf(MIMEPNG) }

// JPEG returns the result's image/jpeg, decoded.
func (r CodeResult) JPEG() ([]byte, bool) { return r.BytesOf(MIMEJPEG) }

// JSON returns the result's application/json value as sent, for json.Unmarshal.
func (r CodeResult) JSON() (json.RawMessage, bool) {
	v, ok := r.Data[MIMEJSON]
	return v, ok
}

// TextOf returns the value of a text-valued MIME type; false if the result has none, or its
// value is not a JSON string.
func (r CodeResult) TextOf(mime string) (string, bool) {
	v, ok := r.Data[mime]
	if !ok {
		return "", false
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false
	}
	return s, true
}

// BytesOf returns the value of a base64-valued MIME type, decoded (line breaks in the base64
// are allowed, as Jupyter sometimes sends them).
func (r CodeResult) BytesOf(mime string) ([]byte, bool) {
	s, ok := r.TextOf(mime)
	if !ok {
		return nil, false
	}
	s = strings.Map(func(c rune) rune {
		if c == '\n' || c == '\r' || c == ' ' || c == '\t' {
			return -1
		}
		return c
	}, s)
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, false
	}
	return b, true
}

// MIMETypes returns the result's MIME types, sorted.
func (r CodeResult) MIMETypes() []string {
	out := make([]string, 0, len(r.Data))
	for k := range r.Data {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// CodeError is an exception a cell raised: its class (Name), message (Value) and traceback. It is
// part of a CodeExecution, not an error of the call; it implements error so that a caller may
// return it as one.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

func (e *CodeError) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// Code event types, in CodeEvent.Type.
const (
	CodeEventStdout          = "stdout"
	CodeEventStderr          = "stderr"
	CodeEventResult          = "result"
	CodeEventError           = "error"
	CodeEventKernelRestarted = "kernel_restarted"
	CodeEventEnd             = "end"
)

// CodeEvent is one event of a running cell, in order: "kernel_restarted" (Text: why; it comes
// first), "stdout" and "stderr" (Text), "result" (Result), "error" (Error: the exception), and
// last "end" (ExecutionCount; or Err if the run could not finish, for example because the
// sandbox went away). Types this SDK does not know are passed on with only Type and Raw set.
type CodeEvent struct {
	Type           string
	Text           string
	Result         *CodeResult
	Error          *CodeError
	ExecutionCount int
	Err            *Error
	Raw            json.RawMessage // the event's data as sent
}

// RunCode runs a cell in the code interpreter of sandbox id and returns what it produced once it
// has finished (the server collects at most 16 MiB of output; RunCodeStream has no such limit).
func (c *Client) RunCode(ctx context.Context, id string, req RunCodeRequest) (*CodeExecution, error) {
	var res CodeExecution
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/code"), json: req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// RunCodeEvents runs a cell and returns its event stream. The caller closes the stream; closing
// it early interrupts the cell.
func (c *Client) RunCodeEvents(ctx context.Context, id string, req RunCodeRequest) (*Stream[CodeEvent], error) {
	resp, err := c.stream(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/code"), json: req})
	if err != nil {
		return nil, err
	}
	return newStream(resp.Body, decodeCodeEvent), nil
}

// RunCodeStream runs a cell, calls fn (if not nil) with each of its events as it arrives, and
// returns the execution assembled from them once the cell has finished. An end event that says
// the run could not finish is returned as an *Error; an error from fn stops the run (the cell is
// interrupted) and is returned as is.
func (c *Client) RunCodeStream(ctx context.Context, id string, req RunCodeRequest, fn func(CodeEvent) error) (*CodeExecution, error) {
	s, err := c.RunCodeEvents(ctx, id, req)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return FollowCode(s, fn)
}

// FollowCode reads s until its end event, calling fn (if not nil) with every event, and returns
// the execution assembled from the events. It does not close s.
func FollowCode(s *Stream[CodeEvent], fn func(CodeEvent) error) (*CodeExecution, error) {
	res := &CodeExecution{Results: []CodeResult{}}
	var stdout, stderr strings.Builder
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("run code: stream ended before the cell did: %w", io.ErrUnexpectedEOF)
		}
		if err != nil {
			return nil, fmt.Errorf("run code: %w", err)
		}
		if fn != nil {
			if err := fn(ev); err != nil {
				return nil, err
			}
		}
		switch ev.Type {
		case CodeEventStdout:
			stdout.WriteString(ev.Text)
		case CodeEventStderr:
			stderr.WriteString(ev.Text)
		case CodeEventResult:
			res.Results = append(res.Results, *ev.Result)
		case CodeEventError:
			res.Error = ev.Error
		case CodeEventKernelRestarted:
			res.KernelRestarted = ev.Text
		case CodeEventEnd:
			if ev.Err != nil {
				return nil, ev.Err
			}
			res.Stdout, res.Stderr = stdout.String(), stderr.String()
			res.ExecutionCount = ev.ExecutionCount
			return res, nil
		}
	}
}

// codeEventWire is the union of the code events' JSON objects.
type codeEventWire struct {
	Text           string `json:"text"`
	Reason         string `json:"reason"`
	ExecutionCount int    `json:"execution_count"`
	Error          *struct {
		// Code is an API error code; a number (an HTTP status) is accepted as well.
		Code    json.RawMessage `json:"code"`
		Message string          `json:"message"`
	} `json:"error"`
}

func decodeCodeEvent(ev sseEvent) (CodeEvent, bool, error) {
	out := CodeEvent{Type: ev.Type, Raw: json.RawMessage(ev.Data)}
	data := []byte(ev.Data)
	var err error
	switch ev.Type {
	case CodeEventStdout, CodeEventStderr, CodeEventKernelRestarted, CodeEventEnd:
		var w codeEventWire
		if err = json.Unmarshal(data, &w); err != nil {
			break
		}
		out.Text, out.ExecutionCount = w.Text, w.ExecutionCount
		if ev.Type == CodeEventKernelRestarted {
			out.Text = w.Reason
		}
		if ev.Type == CodeEventEnd && w.Error != nil {
			out.Err = streamError(w.Error.Code, w.Error.Message, "the run could not finish")
		}
	case CodeEventResult:
		var r CodeResult
		if err = json.Unmarshal(data, &r); err == nil {
			out.Result = &r
		}
	case CodeEventError:
		var e CodeError
		if err = json.Unmarshal(data, &e); err == nil {
			out.Error = &e
		}
	}
	if err != nil {
		return CodeEvent{}, false, fmt.Errorf("decode %s event: %w", ev.Type, err)
	}
	return out, true, nil
}

// streamError is the *Error for an error reported inside an event stream, whose code is an API
// error code or, from some servers, an HTTP status.
func streamError(code json.RawMessage, message, fallback string) *Error {
	e := &Error{Status: http.StatusInternalServerError, Message: message}
	var word string
	var status int
	switch {
	case json.Unmarshal(code, &word) == nil && word != "":
		e.Code, e.Status = word, statusForCode(word)
	case json.Unmarshal(code, &status) == nil && status >= 400 && status <= 599:
		e.Code, e.Status = codeForStatus(status), status
	}
	if e.Message == "" {
		e.Message = fallback
	}
	return e
}

// CodeContext is one kernel of a sandbox's code interpreter, with its own state, language and
// working directory.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
	// Restarted is set when spaced restarted the context's kernel (the sandbox was restored from
	// a filesystem snapshot): its state is gone.
	Restarted bool `json:"restarted,omitempty"`
}

// ListCodeContexts lists the contexts of sandbox id's code interpreter, the default Python and
// JavaScript ones included.
func (c *Client) ListCodeContexts(ctx context.Context, id string) ([]CodeContext, error) {
	var out []CodeContext
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/code/contexts")}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// CreateCodeContext starts a new context of language (default "python") in the working
// directory cwd (default the user's home, /home/user). Run cells in it with
// RunCodeRequest.ContextID.
func (c *Client) CreateCodeContext(ctx context.Context, id, language, cwd string) (*CodeContext, error) {
	body := struct {
		Language string `json:"language,omitempty"`
		Cwd      string `json:"cwd,omitempty"`
	}{language, cwd}
	var out CodeContext
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/code/contexts"), json: body}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteCodeContext shuts a context's kernel down.
func (c *Client) DeleteCodeContext(ctx context.Context, id, contextID string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: codeContextPath(id, contextID, "")}, nil)
}

// RestartCodeContext restarts a context's kernel: it keeps its ID, language and working
// directory, but its variables and imports are gone.
func (c *Client) RestartCodeContext(ctx context.Context, id, contextID string) error {
	return c.do(ctx, request{method: http.MethodPost, path: codeContextPath(id, contextID, "/restart")}, nil)
}

func codeContextPath(id, contextID, rest string) string {
	return sandboxPath(id, "/code/contexts/", url.PathEscape(contextID), rest)
}
