package api

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/e2b"
	"github.com/space-sandbox/space/internal/egress/credentials"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/template/build"
)

// Config holds the Server's dependencies.
type Config struct {
	Sandboxes *sandbox.Manager
	// Templates lists, builds and deletes templates (default: one without a template store,
	// which refuses to).
	Templates *build.Builder
	// Secrets keeps tenants' credential secrets (default: none kept).
	Secrets *credentials.Vault
	Keys    *auth.Keys
	Logger  *slog.Logger
	Version string
	// MaxUpload bounds one file upload in bytes (default 16 GiB).
	MaxUpload int64
	// Domain, if set, is the E2B sandbox domain: envd requests for 49983-<id>.<Domain> go to
	// sandbox <id>'s agent.
	Domain string
	// SpoolDir holds the output of commands answered as one JSON object while they run
	// (spaced: $SPACE_HOME/spool; default the system's temporary directory). SpoolBytes bounds
	// what all of it may hold at once (default 1 GiB), SpoolPerOutput one stream of one command
	// (default 256 MiB).
	SpoolDir       string
	SpoolBytes     int64
	SpoolPerOutput int64
}

// Server is spaced's HTTP handler.
type Server struct {
	sb      *sandbox.Manager
	tpl     *build.Builder
	secrets *credentials.Vault
	keys    *auth.Keys
	log     *slog.Logger
	version string
	maxUp   int64
	metrics *metrics
	spool   *spool
	mux     *http.ServeMux
	e2b     *e2b.Handler
}

// New builds the handler with every route of API.md.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxUpload == 0 {
		cfg.MaxUpload = 16 << 30
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = os.TempDir()
	}
	if cfg.SpoolBytes == 0 {
		cfg.SpoolBytes = 1 << 30
	}
	if cfg.SpoolPerOutput == 0 {
		cfg.SpoolPerOutput = 256 << 20
	}
	if cfg.Templates == nil {
		cfg.Templates = build.New(build.Config{Lifecycle: cfg.Sandboxes, Logger: cfg.Logger})
	}
	if cfg.Secrets == nil {
		cfg.Secrets = credentials.New(credentials.Config{Logger: cfg.Logger})
	}
	s := &Server{sb: cfg.Sandboxes, tpl: cfg.Templates, secrets: cfg.Secrets, keys: cfg.Keys, log: cfg.Logger, version: cfg.Version, maxUp: cfg.MaxUpload, metrics: newMetrics(),
		spool: newSpool(cfg.SpoolDir, cfg.SpoolBytes, cfg.SpoolPerOutput), mux: http.NewServeMux()}
	s.routes()
	s.e2b = e2b.New(e2b.Config{Sandboxes: cfg.Sandboxes, Keys: cfg.Keys, Logger: cfg.Logger, Domain: cfg.Domain,
		Status: func(err error) (int, string) {
			status, _ := statusOf(err)
			return status, messageOf(err, status)
		}})
	return s
}

func (s *Server) routes() {
	m := s.mux
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	m.HandleFunc("GET /metrics", s.handleMetrics)

	a := func(pattern string, h func(http.ResponseWriter, *http.Request, auth.Principal)) {
		m.HandleFunc(pattern, s.authed(h))
	}
	a("GET /v1/info", s.handleInfo)
	a("POST /v1/keys", s.handleCreateKey)
	a("GET /v1/keys", s.handleListKeys)
	a("DELETE /v1/keys/{id}", s.handleRevokeKey)
	a("GET /v1/events", s.handleEvents)

	a("POST /v1/sandboxes", s.handleCreate)
	a("GET /v1/sandboxes", s.handleList)
	a("GET /v1/sandboxes/{id}", s.handleGet)
	a("DELETE /v1/sandboxes/{id}", s.handleDelete)
	a("POST /v1/sandboxes/{id}/timeout", s.handleTimeout)
	a("POST /v1/sandboxes/{id}/pause", s.handlePause)
	a("POST /v1/sandboxes/{id}/resume", s.handleResume)
	a("POST /v1/sandboxes/{id}/fork", s.handleFork)
	a("PATCH /v1/sandboxes/{id}/network", s.handleUpdateNetwork)
	a("GET /v1/sandboxes/{id}/egress", s.handleEgress)
	a("GET /v1/sandboxes/{id}/ports/{port}/{path...}", s.handlePort)
	a("POST /v1/sandboxes/{id}/ports/{port}/{path...}", s.handlePort)
	a("PUT /v1/sandboxes/{id}/ports/{port}/{path...}", s.handlePort)
	a("PATCH /v1/sandboxes/{id}/ports/{port}/{path...}", s.handlePort)
	a("DELETE /v1/sandboxes/{id}/ports/{port}/{path...}", s.handlePort)
	a("POST /v1/sandboxes/{id}/snapshots", s.handleCreateSnapshot)
	a("GET /v1/sandboxes/{id}/snapshots", s.handleListSnapshots)
	a("POST /v1/sandboxes/{id}/restore", s.handleRestore)
	a("GET /v1/sandboxes/{id}/lineage", s.handleLineage)
	a("GET /v1/snapshots", s.handleAllSnapshots)
	a("GET /v1/snapshots/{sid}", s.handleGetSnapshot)
	a("DELETE /v1/snapshots/{sid}", s.handleDeleteSnapshot)
	a("GET /v1/snapshots/{sid}/diff", s.handleDiff)

	a("POST /v1/sandboxes/{id}/exec", s.handleExec)
	a("GET /v1/sandboxes/{id}/processes", s.handleProcesses)
	a("GET /v1/sandboxes/{id}/processes/{pid}/events", s.handleProcessEvents)
	a("POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.handleStdin)
	a("POST /v1/sandboxes/{id}/processes/{pid}/signal", s.handleSignal)
	a("POST /v1/sandboxes/{id}/processes/{pid}/resize", s.handleResize)

	a("POST /v1/sandboxes/{id}/code", s.handleRunCode)
	a("GET /v1/sandboxes/{id}/code/contexts", s.handleListContexts)
	a("POST /v1/sandboxes/{id}/code/contexts", s.handleCreateContext)
	a("DELETE /v1/sandboxes/{id}/code/contexts/{ctx}", s.handleDeleteContext)
	a("POST /v1/sandboxes/{id}/code/contexts/{ctx}/restart", s.handleRestartContext)

	a("PUT /v1/sandboxes/{id}/files", s.handleUpload)
	a("GET /v1/sandboxes/{id}/files", s.handleDownload)
	a("DELETE /v1/sandboxes/{id}/files", s.handleRemove)
	a("GET /v1/sandboxes/{id}/fs", s.handleListDir)
	a("POST /v1/sandboxes/{id}/fs/mkdir", s.handleMkdir)
	a("POST /v1/sandboxes/{id}/fs/move", s.handleMove)
	a("GET /v1/sandboxes/{id}/fs/watch", s.handleWatch)

	a("PUT /v1/secrets/{name}", s.handlePutSecret)
	a("GET /v1/secrets", s.handleListSecrets)
	a("DELETE /v1/secrets/{name}", s.handleDeleteSecret)

	a("GET /v1/templates", s.handleListTemplates)
	a("POST /v1/templates", s.handleBuildTemplate)
	a("DELETE /v1/templates/{name}", s.handleDeleteTemplate)

	m.HandleFunc("/v1/", s.authed(func(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
		s.writeError(w, r, errdefs.NotFound("no such route: "+r.Method+" "+r.URL.Path))
	}))
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	if s.e2b.Claims(r) { // E2B's wire protocol, for unmodified E2B SDKs
		s.e2b.ServeHTTP(rw, r)
	} else {
		s.mux.ServeHTTP(rw, r)
	}
	s.metrics.observe(r.Method, rw.status, time.Since(start))
}

type principalKey struct{}

// authed wraps h with API key authentication.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := auth.FromRequestHeaders(r.Header.Get("Authorization"), r.Header.Get("X-API-Key"))
		p, err := s.keys.Authenticate(r.Context(), key)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		// The request ends at once if its key is revoked while it runs (an event stream, a
		// proxied connection); a new request with the key fails Authenticate.
		if err := pathIDError(r); err != nil {
			s.writeError(w, r, err)
			return
		}
		ctx, done := s.keys.Bind(r.Context(), p.KeyID)
		defer done()
		h(w, r.WithContext(context.WithValue(ctx, principalKey{}, p)), p)
	}
}

// statusWriter records the status for metrics and passes Flush and friends through.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func pathPID(r *http.Request) (uint32, error) {
	n, err := strconv.ParseUint(r.PathValue("pid"), 10, 32)
	if err != nil || n == 0 {
		return 0, errdefs.InvalidArgument("pid: want a positive integer")
	}
	return uint32(n), nil
}
