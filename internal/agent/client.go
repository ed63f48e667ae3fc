package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/space-sandbox/space/internal/agentpb/filesystem/filesystemconnect"
	"github.com/space-sandbox/space/internal/agentpb/process/processconnect"
	"github.com/space-sandbox/space/internal/errdefs"
)

const (
	accessTokenHeader = "X-Access-Token"
	readyPoll         = 2 * time.Millisecond
	readyBackoff      = 10 * time.Millisecond
	readyAttempt      = 250 * time.Millisecond
	// messageMax bounds one message read from an agent. The agent runs inside the sandbox,
	// which may replace it with a server of its own: what it answers is an attacker's, and a
	// message without bound would be one without bound in spaced's memory.
	messageMax = 32 << 20
)

// Client talks to one sandbox's agent. It is safe for concurrent use; keep one per sandbox so
// its connections are reused.
type Client struct {
	base  string
	token string
	hc    *http.Client
	proc  processconnect.ProcessClient
	fs    filesystemconnect.FilesystemClient
}

// NewClient returns a client of the agent at baseURL (e.g. "http://10.211.0.2:49983") that
// presents token (if non-empty). hc carries every request; nil means a client of its own that
// keeps connections alive and never uses a proxy.
func NewClient(baseURL, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	base := strings.TrimRight(baseURL, "/")
	return &Client{
		base: base, token: token, hc: hc,
		proc: processconnect.NewProcessClient(hc, base, connect.WithReadMaxBytes(messageMax)),
		fs:   filesystemconnect.NewFilesystemClient(hc, base, connect.WithReadMaxBytes(messageMax)),
	}
}

// newRequest wraps msg with the token and, if user is set, the envd user header.
func newRequest[T any](c *Client, msg *T, user string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	c.setHeaders(req.Header(), user)
	return req
}

func (c *Client) setHeaders(h http.Header, user string) {
	if c.token != "" {
		h.Set(accessTokenHeader, c.token)
	}
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// Health checks GET /health once.
func (c *Client) Health(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/health", nil)
	if err != nil {
		return fmt.Errorf("agent health: %w", err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return transportError("agent health", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("agent health: status %d", resp.StatusCode))
	}
	return nil
}

// Rotate gives the agent newToken as its access token, authorized by the client's current one.
// The client keeps the old token: make a new Client for newToken.
func (c *Client) Rotate(ctx context.Context, newToken string) error {
	return c.init(ctx, map[string]any{"accessToken": newToken})
}

// SetEnv gives the agent variables every later command starts with (over its base
// environment; a command's own variables still win), replacing those set before.
func (c *Client) SetEnv(ctx context.Context, env map[string]string) error {
	if env == nil {
		env = map[string]string{}
	}
	return c.init(ctx, map[string]any{"envVars": env})
}

// init posts body to the agent's /init.
func (c *Client) init(ctx context.Context, body map[string]any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("agent init: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/init", bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("agent init: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	c.setHeaders(req.Header, "")
	resp, err := c.hc.Do(req)
	if err != nil {
		return transportError("agent init", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return httpError(resp)
	}
	return nil
}

// RestoreTree replaces each of paths in the sandbox with what the tar stream body holds for it
// (names relative to /); paths body lacks are just removed.
func (c *Client) RestoreTree(ctx context.Context, paths []string, body io.Reader) error {
	q := url.Values{"path": paths}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/restore?"+q.Encode(), body)
	if err != nil {
		return fmt.Errorf("agent restore: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-tar")
	c.setHeaders(req.Header, "")
	resp, err := c.hc.Do(req)
	if err != nil {
		return transportError("agent restore", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return httpError(resp)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return nil
}

// WaitReady polls Health every ~2 ms (10 ms while connections are refused, so a sandbox that
// is still booting costs no CPU) until it succeeds or ctx is done.
func (c *Client) WaitReady(ctx context.Context) error {
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, readyAttempt)
		err := c.Health(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil { // the attempt was cut short by ctx: keep the previous error
			return notReady(ctx, last)
		}
		last = err
		wait := readyPoll
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
			wait = readyBackoff
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return notReady(ctx, last)
		case <-t.C:
		}
	}
}

func notReady(ctx context.Context, last error) error {
	if last == nil {
		last = ctx.Err()
	}
	return fmt.Errorf("agent not ready: %w (last: %w)", errdefs.ErrUnavailable, last)
}

// transportError classifies an error of the HTTP client: a context error stays one, anything
// else (refused, reset, unreachable) is ErrUnavailable. The cause stays in the chain.
func transportError(op string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %w: %w", op, errdefs.ErrUnavailable, err)
}

// rpcError maps a Connect error to an errdefs class, keeping the agent's message.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return fmt.Errorf("agent: %w", err)
	}
	if !connect.IsWireError(err) {
		switch ce.Code() {
		case connect.CodeCanceled, connect.CodeDeadlineExceeded, connect.CodeUnavailable:
			// ctx ended, or the agent could not be reached: classified below as ever
		default:
			// Made by this client, not sent by the agent: its answer could not be read (a
			// string that is not UTF-8, a message past messageMax, bytes that are not a
			// message). The agent is what failed, as a gateway's upstream: 502, never the
			// client's fault (invalid_argument) or spaced's own (internal).
			return &classified{class: errdefs.ErrUpstream, msg: "the sandbox's agent sent an answer spaced cannot read: " + ce.Message(), cause: err}
		}
	}
	var cls error
	switch ce.Code() {
	case connect.CodeNotFound:
		cls = errdefs.ErrNotFound
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		cls = errdefs.ErrInvalidArgument
	case connect.CodeAlreadyExists:
		cls = errdefs.ErrAlreadyExists
	case connect.CodeFailedPrecondition:
		cls = errdefs.ErrFailedPrecondition
	case connect.CodeUnauthenticated:
		cls = errdefs.ErrUnauthenticated
	case connect.CodePermissionDenied:
		cls = errdefs.ErrPermissionDenied
	case connect.CodeResourceExhausted:
		cls = errdefs.ErrResourceExhausted
	case connect.CodeUnavailable:
		cls = errdefs.ErrUnavailable
	default:
		return fmt.Errorf("agent: %w", err) // canceled, deadline exceeded, internal, ...
	}
	return &classified{class: cls, msg: ce.Message(), cause: err}
}

// classified is an agent error of a known class. Its message is the agent's; errors.Is
// matches both the class and the underlying Connect error's chain.
type classified struct {
	class error
	msg   string
	cause error
}

func (e *classified) Error() string   { return e.msg }
func (e *classified) Unwrap() []error { return []error{e.class, e.cause} }

// httpError turns a non-2xx /files response into a classified error.
func httpError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	msg := strings.TrimSpace(string(body))
	var je struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &je) == nil && je.Message != "" {
		msg = je.Message
	}
	if msg == "" {
		msg = resp.Status
	}
	var cls error
	switch resp.StatusCode {
	case http.StatusNotFound:
		cls = errdefs.ErrNotFound
	case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusNotAcceptable:
		cls = errdefs.ErrInvalidArgument
	case http.StatusUnauthorized:
		cls = errdefs.ErrUnauthenticated
	case http.StatusForbidden:
		cls = errdefs.ErrPermissionDenied
	case http.StatusConflict:
		cls = errdefs.ErrFailedPrecondition
	case http.StatusInsufficientStorage, http.StatusRequestEntityTooLarge:
		cls = errdefs.ErrResourceExhausted
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		cls = errdefs.ErrUnavailable
	default:
		return fmt.Errorf("agent: status %d: %s", resp.StatusCode, msg)
	}
	return errdefs.New(cls, msg)
}
