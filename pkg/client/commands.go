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
	"strconv"
)

// Exec runs a command to completion and returns its output. A non-zero exit is not an error:
// look at ExitCode. For long or chatty commands prefer ExecStream, which does not hold the
// output in memory.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	var res ExecResult
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/exec"), json: req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecBackground starts a command and returns its PID at once. Follow it with ProcessEvents,
// feed it with WriteStdin, stop it with Signal.
func (c *Client) ExecBackground(ctx context.Context, id string, req ExecRequest) (int, error) {
	req.Background = true
	var res struct {
		PID int `json:"pid"`
	}
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/exec"), json: req}, &res); err != nil {
		return 0, err
	}
	return res.PID, nil
}

// ExecEvents runs a command and returns its event stream: start, then stdout and stderr as they
// are produced, then exit (or error). The caller closes the stream.
func (c *Client) ExecEvents(ctx context.Context, id string, req ExecRequest) (*Stream[ExecEvent], error) {
	resp, err := c.stream(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/exec"), json: req})
	if err != nil {
		return nil, err
	}
	return newStream(resp.Body, decodeExecEvent), nil
}

// ExecStream runs a command, calls fn with each of its events as it arrives, and returns the
// result once the command exits (Stdout and Stderr are left empty: fn saw them). An error event
// is returned as an *Error; an error from fn stops the stream and is returned as is.
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest, fn func(ExecEvent) error) (*ExecResult, error) {
	s, err := c.ExecEvents(ctx, id, req)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return FollowExec(s, fn)
}

// ProcessEvents streams the events of process pid: its output since it started, then live
// output, then its exit. The caller closes the stream.
func (c *Client) ProcessEvents(ctx context.Context, id string, pid int) (*Stream[ExecEvent], error) {
	resp, err := c.stream(ctx, request{method: http.MethodGet, path: processPath(id, pid, "/events")})
	if err != nil {
		return nil, err
	}
	return newStream(resp.Body, decodeExecEvent), nil
}

// FollowExec reads s until the command's exit event, calling fn (if not nil) with every event,
// and returns the command's PID, exit code and duration. It does not close s.
func FollowExec(s *Stream[ExecEvent], fn func(ExecEvent) error) (*ExecResult, error) {
	var res ExecResult
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("exec: stream ended before the command exited: %w", io.ErrUnexpectedEOF)
		}
		if err != nil {
			return nil, fmt.Errorf("exec: %w", err)
		}
		if fn != nil {
			if err := fn(ev); err != nil {
				return nil, err
			}
		}
		switch ev.Type {
		case EventStart:
			res.PID = ev.PID
		case EventExit:
			res.ExitCode, res.DurationMs = ev.ExitCode, ev.DurationMs
			return &res, nil
		case EventError:
			return nil, ev.Err
		}
	}
}

// ListProcesses lists the processes started in the sandbox id.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]Process, error) {
	var out struct {
		Processes []Process `json:"processes"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/processes")}, &out); err != nil {
		return nil, err
	}
	return out.Processes, nil
}

// WriteStdin streams r to the standard input of process pid; r may be nil. With eof, the
// process's standard input is closed afterwards.
func (c *Client) WriteStdin(ctx context.Context, id string, pid int, r io.Reader, eof bool) error {
	q := url.Values{}
	if eof {
		q.Set("eof", "true")
	}
	return c.do(ctx, request{
		method: http.MethodPost, path: processPath(id, pid, "/stdin"), query: q,
		body: r, contentType: "application/octet-stream",
	}, nil)
}

// CloseStdin closes the standard input of process pid.
func (c *Client) CloseStdin(ctx context.Context, id string, pid int) error {
	return c.WriteStdin(ctx, id, pid, nil, true)
}

// Signal sends a signal, named like "SIGTERM", to process pid.
func (c *Client) Signal(ctx context.Context, id string, pid int, signal string) error {
	body := struct {
		Signal string `json:"signal"`
	}{signal}
	return c.do(ctx, request{method: http.MethodPost, path: processPath(id, pid, "/signal"), json: body}, nil)
}

// ResizePTY sets the terminal size of process pid, which was started with a PTY.
func (c *Client) ResizePTY(ctx context.Context, id string, pid int, size PTYSize) error {
	return c.do(ctx, request{method: http.MethodPost, path: processPath(id, pid, "/resize"), json: size}, nil)
}

func processPath(id string, pid int, rest string) string {
	return sandboxPath(id, "/processes/", strconv.Itoa(pid), rest)
}

// execEventWire is the union of the exec events' JSON objects.
type execEventWire struct {
	PID        int     `json:"pid"`
	Data       *string `json:"data"`
	DataB64    *string `json:"data_b64"`
	ExitCode   int     `json:"exit_code"`
	DurationMs int64   `json:"duration_ms"`
	Code       string  `json:"code"`
	Message    string  `json:"message"`
	// Error is the nested form {"error": {"code", "message"}}, accepted as well.
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeExecEvent(ev sseEvent) (ExecEvent, bool, error) {
	out := ExecEvent{Type: ev.Type, Raw: json.RawMessage(ev.Data)}
	switch ev.Type {
	case EventStart, EventStdout, EventStderr, EventExit, EventError:
	default:
		return out, true, nil
	}
	var w execEventWire
	if err := json.Unmarshal([]byte(ev.Data), &w); err != nil {
		return ExecEvent{}, false, fmt.Errorf("decode %s event: %w", ev.Type, err)
	}
	switch ev.Type {
	case EventStart:
		out.PID = w.PID
	case EventStdout, EventStderr:
		switch {
		case w.DataB64 != nil:
			b, err := base64.StdEncoding.DecodeString(*w.DataB64)
			if err != nil {
				return ExecEvent{}, false, fmt.Errorf("decode %s event: data_b64: %w", ev.Type, err)
			}
			out.Data = b
		case w.Data != nil:
			out.Data = []byte(*w.Data)
		}
	case EventExit:
		out.ExitCode, out.DurationMs = w.ExitCode, w.DurationMs
	case EventError:
		e := &Error{Status: http.StatusOK, Code: w.Code, Message: w.Message}
		if w.Error != nil {
			e.Code, e.Message = w.Error.Code, w.Error.Message
		}
		if e.Message == "" {
			e.Message = "the command could not finish"
		}
		out.Err = e
	}
	return out, true, nil
}
