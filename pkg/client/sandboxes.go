package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// CreateSandbox creates a sandbox and returns it once it is running.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/sandboxes", json: req}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// GetSandbox returns the sandbox id.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id)}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListSandboxes returns the caller's sandboxes that match opts.
func (c *Client) ListSandboxes(ctx context.Context, opts ListSandboxesOptions) ([]Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	for k, v := range opts.Metadata {
		q.Set("metadata."+k, v)
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes", query: q}, &out); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}

// DeleteSandbox deletes the sandbox id and everything in it.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: sandboxPath(id)}, nil)
}

// SetTimeout makes the sandbox expire seconds from now.
func (c *Client) SetTimeout(ctx context.Context, id string, seconds int) (*Sandbox, error) {
	body := struct {
		TimeoutSeconds int `json:"timeout_seconds"`
	}{seconds}
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/timeout"), json: body}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// UpdateNetwork replaces the egress policy of the running sandbox id.
func (c *Client) UpdateNetwork(ctx context.Context, id string, egress Egress) (*Sandbox, error) {
	body := struct {
		Egress Egress `json:"egress"`
	}{egress}
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPatch, path: sandboxPath(id, "/network"), json: body}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// PauseSandbox pauses the sandbox id; its memory, processes and files are durable on return.
func (c *Client) PauseSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/pause")}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ResumeSandbox resumes the paused sandbox id where it stopped.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/resume")}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ForkSandbox makes count independent running copies of sandbox id's current state (memory,
// processes, files); each has its own ID, token and network slot.
func (c *Client) ForkSandbox(ctx context.Context, id string, count int) ([]Sandbox, error) {
	body := struct {
		Count int `json:"count"`
	}{count}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/fork"), json: body}, &out); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}

// EgressEvent is one decision of the egress gateway about a sandbox's connection or query.
type EgressEvent struct {
	Time     time.Time `json:"time"`
	Host     string    `json:"host"`
	IP       string    `json:"ip"`
	Port     int       `json:"port"`
	Proto    string    `json:"proto"`
	Decision string    `json:"decision"` // allow or deny
	Reason   string    `json:"reason"`
}

// EgressEvents returns sandbox id's recent egress decisions, oldest first.
func (c *Client) EgressEvents(ctx context.Context, id string) ([]EgressEvent, error) {
	var out struct {
		Events []EgressEvent `json:"events"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/egress")}, &out); err != nil {
		return nil, err
	}
	return out.Events, nil
}

// Secret describes a stored credential (never its value).
type Secret struct {
	Name      string    `json:"name"`
	Hosts     []string  `json:"hosts"`
	Header    string    `json:"header"`
	CreatedAt time.Time `json:"created_at"`
}

// PutSecretRequest stores a credential for the egress gateway to set on TLS requests to Hosts.
type PutSecretRequest struct {
	Value  string   `json:"value"`
	Hosts  []string `json:"hosts"`
	Header string   `json:"header,omitempty"` // default Authorization
	Format string   `json:"format,omitempty"` // default "Bearer {value}"
}

// PutSecret creates or replaces the secret name.
func (c *Client) PutSecret(ctx context.Context, name string, req PutSecretRequest) error {
	return c.do(ctx, request{method: http.MethodPut, path: "/v1/secrets/" + url.PathEscape(name), json: req}, nil)
}

// ListSecrets lists the tenant's secrets.
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	var out struct {
		Secrets []Secret `json:"secrets"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/secrets"}, &out); err != nil {
		return nil, err
	}
	return out.Secrets, nil
}

// DeleteSecret deletes the secret name.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/secrets/" + url.PathEscape(name)}, nil)
}

// WatchEgress streams sandbox id's egress decisions from now on. The caller closes the stream.
func (c *Client) WatchEgress(ctx context.Context, id string) (*Stream[EgressEvent], error) {
	resp, err := c.stream(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/egress")})
	if err != nil {
		return nil, err
	}
	return newStream(resp.Body, func(ev sseEvent) (EgressEvent, bool, error) {
		if ev.Type != "egress" {
			return EgressEvent{}, false, nil
		}
		var e EgressEvent
		if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
			return EgressEvent{}, false, fmt.Errorf("decode egress event: %w", err)
		}
		return e, true, nil
	}), nil
}
