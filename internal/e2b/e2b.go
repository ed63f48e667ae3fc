// Package e2b serves E2B's wire protocol on spaced's listener, so that an unmodified E2B SDK
// works against spaced (../shared/E2B-WIRE.md): the control-plane REST routes, mapped onto the
// same sandbox lifecycle as the native API, and the envd routes of every sandbox (process and
// filesystem services over Connect, /files, /health), routed by the E2b-Sandbox-Id header (or a
// 49983-<id>.<domain> host name) and forwarded to the sandbox's agent, which speaks envd's
// protocol itself. There is no second implementation of anything.
package e2b

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/jsondepth"
	"github.com/space-sandbox/space/internal/sandbox"
)

// EnvdVersion is the envd version spaced's agent is compatible with (E2B-WIRE.md §3 gates).
const EnvdVersion = "0.5.7"

// Config holds the handler's dependencies.
type Config struct {
	Sandboxes *sandbox.Manager
	Keys      *auth.Keys
	Logger    *slog.Logger
	// Domain, if set, routes envd requests by host name 49983-<id>.<Domain> too, and is the
	// domain returned to the SDK.
	Domain string
	// Status maps an error to an HTTP status and a message (the API's one mapping).
	Status func(error) (int, string)
}

// Handler serves the E2B routes.
type Handler struct {
	cfg Config
	sb  *sandbox.Manager
	log *slog.Logger
	mux *http.ServeMux
}

// New returns the E2B handler.
func New(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, sb: cfg.Sandboxes, log: cfg.Logger, mux: http.NewServeMux()}
	a := func(pattern string, f func(http.ResponseWriter, *http.Request, auth.Principal)) {
		h.mux.HandleFunc(pattern, h.authed(f))
	}
	a("POST /sandboxes", h.create)
	a("POST /v2/sandboxes", h.create)
	a("GET /sandboxes", h.listV1)
	a("GET /v2/sandboxes", h.list)
	a("GET /sandboxes/{id}", h.get)
	a("DELETE /sandboxes/{id}", h.kill)
	a("POST /sandboxes/{id}/timeout", h.timeout)
	a("POST /sandboxes/{id}/pause", h.pause)
	a("POST /sandboxes/{id}/resume", h.connect)
	a("POST /sandboxes/{id}/connect", h.connect)
	a("POST /v2/sandboxes/{id}/connect", h.connect)
	a("GET /sandboxes/{id}/metrics", h.metrics)
	a("PUT /sandboxes/{id}/network", h.network)
	a("POST /sandboxes/{id}/snapshots", h.snapshot)
	a("GET /snapshots", h.listSnapshots)
	a("DELETE /templates/{id}", h.deleteSnapshot)
	a("POST /sandboxes/{id}/fork", h.fork)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.writeError(w, errdefs.NotFound("no such route: "+r.Method+" "+r.URL.Path))
	})
	return h
}

// Claims reports whether a request is for the E2B handler: it names a sandbox's envd (header or
// host name), or its path is one of E2B's control-plane paths.
func (h *Handler) Claims(r *http.Request) bool {
	if id, _ := h.sandboxTarget(r); id != "" {
		return true
	}
	p := r.URL.Path
	for _, root := range []string{"/sandboxes", "/v2/sandboxes", "/snapshots", "/templates"} {
		if p == root || strings.HasPrefix(p, root+"/") {
			return true
		}
	}
	return false
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.log.Debug("e2b request", "method", r.Method, "path", r.URL.Path, "sandbox", r.Header.Get("E2b-Sandbox-Id"), "host", r.Host)
	if id, port := h.sandboxTarget(r); id != "" {
		if port == envdPort {
			h.envd(w, r, id)
		} else {
			h.port(w, r, id, port)
		}
		return
	}
	h.mux.ServeHTTP(w, r)
}

// sandboxTarget is the sandbox and port a request is for, or "": the E2b-Sandbox-Id header with
// E2b-Sandbox-Port (default envd's; the SDK tells its code-interpreter requests from envd's only
// by this header when E2B_SANDBOX_URL gives both one origin), or a <port>-<id>.<domain> host.
func (h *Handler) sandboxTarget(r *http.Request) (id string, port int) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port := envdPort
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				return id, 0
			}
			port = n
		}
		return id, port
	}
	return h.hostTarget(r)
}

func (h *Handler) authed(f func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			key = auth.FromRequestHeaders(r.Header.Get("Authorization"), "")
		}
		p, err := h.cfg.Keys.Authenticate(r.Context(), key)
		if err != nil {
			h.writeError(w, err)
			return
		}
		if err := pathIDError(r); err != nil {
			h.writeError(w, err)
			return
		}
		ctx, done := h.cfg.Keys.Bind(r.Context(), p.KeyID)
		defer done()
		f(w, r.WithContext(ctx), p)
	}
}

// writeError writes E2B's error body: {"code": <status>, "message": "..."}.
func (h *Handler) writeError(w http.ResponseWriter, err error) {
	status, msg := h.cfg.Status(err)
	if status >= 500 {
		h.log.Error("e2b request failed", "status", status, "err", err)
	}
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decode reads an optional JSON body into v; unknown fields are ignored (the SDK sends many).
// A body nested past jsondepth.Max is refused before it is decoded, as the native API does.
func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxJSONBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit))
		}
		return errdefs.InvalidArgument("read body: " + err.Error())
	}
	if jsondepth.Of(b) > jsondepth.Max {
		return errdefs.InvalidArgument(fmt.Sprintf("invalid JSON body: nested more than %d deep", jsondepth.Max))
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return errdefs.InvalidArgument("invalid JSON body: " + err.Error())
	}
	return nil
}

// maxJSONBody bounds an E2B request body.
const maxJSONBody = 1 << 20
