package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Events streams the server's events for the caller's tenant: sandbox.created, sandbox.deleted,
// snapshot.created, …. The caller closes the stream.
func (c *Client) Events(ctx context.Context) (*Stream[Event], error) {
	resp, err := c.stream(ctx, request{method: http.MethodGet, path: "/v1/events"})
	if err != nil {
		return nil, err
	}
	return newStream(resp.Body, func(ev sseEvent) (Event, bool, error) {
		if !json.Valid([]byte(ev.Data)) {
			return Event{}, false, fmt.Errorf("decode %s event: data is not JSON", ev.Type)
		}
		return Event{Type: ev.Type, Data: json.RawMessage(ev.Data)}, true, nil
	}), nil
}

// Info describes the server: its version and runtimes.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var info Info
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/info"}, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Healthz returns nil if the server answers its health check.
func (c *Client) Healthz(ctx context.Context) error {
	return c.do(ctx, request{method: http.MethodGet, path: "/healthz"}, nil)
}

// CreateKey creates an API key for tenant. Only an admin key may.
func (c *Client) CreateKey(ctx context.Context, tenant string) (*APIKey, error) {
	body := struct {
		Tenant string `json:"tenant"`
	}{tenant}
	var k APIKey
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/keys", json: body}, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// KeyInfo describes a stored API key; the secret is never shown again after CreateKey.
type KeyInfo struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Admin     bool      `json:"admin"`
	CreatedAt time.Time `json:"created_at"`
}

// ListKeys lists every API key, oldest first. Only an admin key may.
func (c *Client) ListKeys(ctx context.Context) ([]KeyInfo, error) {
	var out struct {
		Keys []KeyInfo `json:"keys"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/keys"}, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// RevokeKey revokes a tenant's API key by ID: its next request fails and its open streams end.
// Only an admin key may; admin keys are retired by changing SPACE_ADMIN_KEY instead.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/keys/" + url.PathEscape(id)}, nil)
}
