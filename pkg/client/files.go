package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// UploadOptions tunes Upload.
type UploadOptions struct {
	// Mode is the new file's permission bits; zero leaves the server's default.
	Mode FileMode
}

// Upload writes r to the file path (absolute) in the sandbox, creating parent directories. r is
// streamed: it is read as the request is sent and never held whole in memory. opts may be nil.
func (c *Client) Upload(ctx context.Context, id, path string, r io.Reader, opts *UploadOptions) (*UploadResult, error) {
	q := url.Values{"path": {path}}
	if opts != nil && opts.Mode != 0 {
		q.Set("mode", opts.Mode.String())
	}
	if r == nil {
		r = http.NoBody
	}
	var res UploadResult
	err := c.do(ctx, request{
		method: http.MethodPut, path: sandboxPath(id, "/files"), query: q,
		body: r, contentType: "application/octet-stream",
	}, &res)
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// Download opens the file path in the sandbox for reading. The content streams from the server
// as the caller reads; the caller closes it.
func (c *Client) Download(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodGet, path: sandboxPath(id, "/files"), query: url.Values{"path": {path}},
		accept: "application/octet-stream",
	})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ListDir lists the directory path in the sandbox.
func (c *Client) ListDir(ctx context.Context, id, path string) ([]Entry, error) {
	var out struct {
		Entries []Entry `json:"entries"`
	}
	err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/fs"), query: url.Values{"path": {path}}}, &out)
	if err != nil {
		return nil, err
	}
	return out.Entries, nil
}

// Mkdir creates the directory path in the sandbox, with its parents.
func (c *Client) Mkdir(ctx context.Context, id, path string) error {
	body := struct {
		Path string `json:"path"`
	}{path}
	return c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/fs/mkdir"), json: body}, nil)
}

// Move renames from to to in the sandbox.
func (c *Client) Move(ctx context.Context, id, from, to string) error {
	body := struct {
		From string `json:"from"`
		To   string `json:"to"`
	}{from, to}
	return c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/fs/move"), json: body}, nil)
}

// Remove deletes path in the sandbox; a directory with contents needs recursive.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.do(ctx, request{method: http.MethodDelete, path: sandboxPath(id, "/files"), query: q}, nil)
}

// WatchDir streams the changes below the directory path (and its subdirectories, with
// recursive). The caller closes the stream.
func (c *Client) WatchDir(ctx context.Context, id, path string, recursive bool) (*Stream[FileChange], error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.stream(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/fs/watch"), query: q})
	if err != nil {
		return nil, err
	}
	return newStream(resp.Body, func(ev sseEvent) (FileChange, bool, error) {
		if ev.Type != "change" {
			return FileChange{}, false, nil
		}
		var ch FileChange
		if err := json.Unmarshal([]byte(ev.Data), &ch); err != nil {
			return FileChange{}, false, fmt.Errorf("decode change event: %w", err)
		}
		return ch, true, nil
	}), nil
}
