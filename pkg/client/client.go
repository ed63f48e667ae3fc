// Package client is the public Go SDK for SPACE's HTTP API (API.md, v1): sandboxes, commands,
// the code interpreter, files, events and server info. It depends only on the standard library,
// so any Go program may import it; the space CLI is built on it.
//
// Every call takes a context; cancelling it aborts the request, including a stream that is being
// read. Failed calls return a *Error when the server answered with an error status.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client talks to one spaced server with one API key. It is safe for concurrent use.
type Client struct {
	base      *url.URL
	apiKey    string
	hc        *http.Client
	userAgent string
}

// Option configures a Client in New.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests with hc. Streams (exec, events, watch) last
// as long as their context, so hc should have no Timeout; bound calls with contexts instead.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// New returns a Client for the server at baseURL (for example "http://127.0.0.1:7070"; a path
// prefix is kept) that authenticates with apiKey. An empty apiKey sends no credentials.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: server URL %q: %w", baseURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("client: server URL %q: scheme must be http or https", baseURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("client: server URL %q has no host", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	u.RawQuery, u.Fragment = "", ""
	c := &Client{base: u, apiKey: apiKey, hc: http.DefaultClient, userAgent: "space-go-client/1"}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Error is an error answer from the server: its HTTP status and the body's
// {"error": {"code", "message"}}. An error event inside a stream is also reported as an Error,
// with the stream's status (200).
type Error struct {
	Status  int    // HTTP status code
	Code    string // API error code: "not_found", "conflict", …
	Message string // human-readable sentence from the server
}

func (e *Error) Error() string {
	switch {
	case e.Message != "" && e.Code != "":
		return fmt.Sprintf("%s (%s)", e.Message, e.Code)
	case e.Message != "":
		return e.Message
	case e.Code != "":
		return e.Code
	}
	return fmt.Sprintf("HTTP %d", e.Status)
}

// IsNotFound reports whether err is the server saying the thing asked for does not exist (or
// belongs to another tenant).
func IsNotFound(err error) bool { return hasStatus(err, http.StatusNotFound) }

// IsConflict reports whether err is the server refusing a call in the resource's current state.
func IsConflict(err error) bool { return hasStatus(err, http.StatusConflict) }

func hasStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// codeForStatus names the API error code of a status, for error answers without a JSON body.
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_argument"
	case http.StatusUnauthorized:
		return "unauthenticated"
	case http.StatusForbidden:
		return "permission_denied"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusConflict:
		return "conflict"
	case http.StatusRequestEntityTooLarge:
		return "too_large"
	case http.StatusTooManyRequests:
		return "resource_exhausted"
	case http.StatusServiceUnavailable:
		return "unavailable"
	case http.StatusBadGateway:
		return "bad_gateway"
	}
	if status >= 500 {
		return "internal"
	}
	return ""
}

// decodeError builds the *Error for a response with an error status and closes its body.
func decodeError(resp *http.Response) error {
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &Error{Status: resp.StatusCode}
	var wire struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &wire) == nil && wire.Error != nil {
		e.Code, e.Message = wire.Error.Code, wire.Error.Message
	} else {
		e.Message = strings.TrimSpace(string(body))
	}
	if e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

// request describes one call.
type request struct {
	method string
	path   string // below the base URL, starting with "/", escaped
	query  url.Values
	accept string
	// Exactly one of json and body may be set.
	json        any
	body        io.Reader
	contentType string
}

// send performs r and returns the response if its status is 2xx; any other status becomes an
// *Error. The caller closes the body.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	// r.path is already escaped (see sandboxPath), so it is appended as text.
	target := c.base.String() + r.path
	if q := r.query.Encode(); q != "" {
		target += "?" + q
	}

	body, contentType := r.body, r.contentType
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("%s %s: encode request: %w", r.method, r.path, err)
		}
		body, contentType = bytes.NewReader(b), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	accept := r.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err // a *url.Error, which names the method and URL
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, decodeError(resp)
	}
	return resp, nil
}

// do performs r and decodes a JSON answer into out, unless out is nil.
func (c *Client) do(ctx context.Context, r request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // drained for reuse
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode response: %w", r.method, r.path, err)
	}
	return nil
}

// stream performs r as a server-sent events request and returns the reader of its body. The
// response must be text/event-stream.
func (c *Client) stream(ctx context.Context, r request) (*http.Response, error) {
	r.accept = "text/event-stream"
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: response is %q, not an event stream", r.method, r.path, ct)
	}
	return resp, nil
}

// sandboxPath is the path of a sandbox's route; the ID is escaped.
func sandboxPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}
