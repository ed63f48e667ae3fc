package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Template is a template as the server lists it.
type Template struct {
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	Parent    string    `json:"parent,omitempty"`
}

// BuildTemplateRequest builds a template from a parent and steps (POST /v1/templates).
type BuildTemplateRequest struct {
	Name  string      `json:"name"`
	From  BuildFrom   `json:"from"`
	Steps []BuildStep `json:"steps,omitempty"`
}

// BuildFrom names the parent: exactly one field.
type BuildFrom struct {
	Template string `json:"template,omitempty"`
	Image    string `json:"image,omitempty"`
}

// BuildStep is one step: exactly one field.
type BuildStep struct {
	Run     string            `json:"run,omitempty"`
	Copy    *CopyStep         `json:"copy,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
}

// CopyStep writes one file into the template.
type CopyStep struct {
	Path       string `json:"path"`
	Content    string `json:"content,omitempty"`
	ContentB64 string `json:"content_b64,omitempty"` // for bytes that are not text
	Mode       uint32 `json:"mode,omitempty"`
}

// ListTemplates lists built-in and built templates.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var out struct {
		Templates []Template `json:"templates"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/templates"}, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// DeleteTemplate deletes a built template (admin).
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/templates/" + url.PathEscape(name)}, nil)
}

// BuildTemplate builds a template (admin), passing each line of the build log to logf (which may
// be nil) as it arrives.
func (c *Client) BuildTemplate(ctx context.Context, req BuildTemplateRequest, logf func(string)) (*Template, error) {
	resp, err := c.stream(ctx, request{method: http.MethodPost, path: "/v1/templates", json: req})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sse := newSSEReader(resp.Body)
	for {
		ev, err := sse.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("build of %s: the log ended without a result", req.Name)
		}
		if err != nil {
			return nil, err
		}
		switch ev.Type {
		case "log":
			var l struct {
				Message string `json:"message"`
			}
			if json.Unmarshal([]byte(ev.Data), &l) == nil && logf != nil {
				logf(l.Message)
			}
		case "done":
			var t Template
			if err := json.Unmarshal([]byte(ev.Data), &t); err != nil {
				return nil, fmt.Errorf("decode done event: %w", err)
			}
			return &t, nil
		case "error":
			var e struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
				return nil, fmt.Errorf("decode error event: %w", err)
			}
			return nil, &Error{Status: statusForCode(e.Code), Code: e.Code, Message: e.Message}
		}
	}
}

// statusForCode is the HTTP status an API error code stands for (an error that arrives inside an
// event stream has no status of its own).
func statusForCode(code string) int {
	for _, s := range []int{400, 401, 403, 404, 409, 413, 429, 502, 503, 500} {
		if codeForStatus(s) == code {
			return s
		}
	}
	return http.StatusInternalServerError
}
