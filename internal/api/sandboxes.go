package api

import (
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
)

type createRequest struct {
	Template       string                `json:"template"`
	Runtime        string                `json:"runtime"`
	TimeoutSeconds *int                  `json:"timeout_seconds"`
	OnTimeout      string                `json:"on_timeout"`
	Env            map[string]string     `json:"env"`
	Metadata       map[string]string     `json:"metadata"`
	Resources      sandbox.Resources     `json:"resources"`
	Network        *sandbox.Network      `json:"network"`
	FromSnapshot   string                `json:"from_snapshot"`
	AutoSnapshot   *sandbox.AutoSnapshot `json:"auto_snapshot"`
}

type sandboxJSON struct {
	ID           string                `json:"id"`
	State        string                `json:"state"`
	Template     string                `json:"template"`
	Runtime      string                `json:"runtime"`
	CreatedAt    time.Time             `json:"created_at"`
	ExpiresAt    time.Time             `json:"expires_at"`
	OnTimeout    string                `json:"on_timeout"`
	Metadata     map[string]string     `json:"metadata"`
	Resources    sandbox.Resources     `json:"resources"`
	Network      sandbox.Network       `json:"network"`
	Parent       *sandbox.Parent       `json:"parent,omitempty"`
	AutoSnapshot *sandbox.AutoSnapshot `json:"auto_snapshot,omitempty"`
	Error        string                `json:"error,omitempty"`
}

// hostPathRE matches what looks like an absolute host path of two or more parts.
var hostPathRE = regexp.MustCompile(`/[^\s/:'"()]+(?:/[^\s/:'"()]*)+`)

// redactHostPaths replaces the absolute paths in a message from the lifecycle (a runtime's
// error, say) with "<path>": where spaced keeps its state is the host's business, not a
// tenant's.
func redactHostPaths(msg string) string { return hostPathRE.ReplaceAllString(msg, "<path>") }

// toJSON describes a sandbox to p; tenants get its error without host paths.
func toJSON(i sandbox.Info, p auth.Principal) sandboxJSON {
	if !p.Admin {
		i.Error = redactHostPaths(i.Error)
	}
	n := i.Spec.Network
	if n.Egress.Allow == nil {
		n.Egress.Allow = []string{}
	}
	if n.Egress.Deny == nil {
		n.Egress.Deny = []string{}
	}
	if n.Credentials == nil {
		n.Credentials = []string{}
	}
	return sandboxJSON{
		ID: i.ID, State: string(i.State), Template: i.Template, Runtime: i.Runtime,
		CreatedAt: i.CreatedAt, ExpiresAt: i.ExpiresAt, OnTimeout: i.OnTimeout, Metadata: i.Metadata,
		Resources: i.Spec.Resources, Network: n, Parent: i.Spec.Parent, AutoSnapshot: i.Spec.AutoSnapshot, Error: i.Error,
	}
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req createRequest
	if err := decodeOptionalJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.FromSnapshot != "" {
		if err := snapshotRefError(req.FromSnapshot); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	info, err := s.sb.Create(r.Context(), p.Tenant, sandbox.CreateRequest{
		Template: req.Template, Runtime: req.Runtime, TimeoutSeconds: req.TimeoutSeconds,
		OnTimeout: req.OnTimeout, Env: req.Env, Metadata: req.Metadata, Resources: req.Resources,
		Network: req.Network, FromSnapshot: req.FromSnapshot, AutoSnapshot: req.AutoSnapshot,
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toJSON(info, p))
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	f := sandbox.ListFilter{Metadata: map[string]string{}}
	for k, vs := range r.URL.Query() {
		switch {
		case k == "state":
			for _, v := range vs {
				for _, st := range strings.Split(v, ",") {
					if st != "" {
						f.States = append(f.States, st)
					}
				}
			}
		case strings.HasPrefix(k, "metadata.") && len(k) > len("metadata."):
			if len(vs) != 1 {
				s.writeError(w, r, errdefs.InvalidArgument(k+": give it once"))
				return
			}
			f.Metadata[strings.TrimPrefix(k, "metadata.")] = vs[0]
		default:
			s.writeError(w, r, errdefs.InvalidArgument("unknown query parameter "+k))
			return
		}
	}
	list, err := s.sb.List(r.Context(), p.Tenant, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]sandboxJSON, 0, len(list))
	for _, i := range list {
		out = append(out, toJSON(i, p))
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	info, err := s.sb.Get(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(info, p))
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := s.sb.Delete(r.Context(), p.Tenant, r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		TimeoutSeconds *int `json:"timeout_seconds"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.TimeoutSeconds == nil {
		s.writeError(w, r, errdefs.InvalidArgument("timeout_seconds is required"))
		return
	}
	info, err := s.sb.SetTimeout(r.Context(), p.Tenant, r.PathValue("id"), *req.TimeoutSeconds)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(info, p))
}

func (s *Server) handleInfo(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	type rt struct {
		Name      string `json:"name"`
		Available bool   `json:"available"`
		Reason    string `json:"reason,omitempty"`
	}
	list, def := s.sb.Runtimes(r.Context())
	out := make([]rt, 0, len(list))
	for _, x := range list {
		out = append(out, rt{x.Name, x.Available, x.Reason})
	}
	type buildJSON struct {
		Template  string    `json:"template"`
		Version   string    `json:"version,omitempty"`
		StartedAt time.Time `json:"started_at"`
		Step      string    `json:"step"`
		Done      int       `json:"done"`
		Total     int       `json:"total"`
	}
	builds := []buildJSON{}
	for _, b := range s.tpl.Builds() {
		builds = append(builds, buildJSON{b.Name, b.Version, b.Started, b.Step, b.Done, b.Total})
	}
	writeJSON(w, http.StatusOK, map[string]any{"version": s.version, "runtimes": out, "default_runtime": def, "builds": builds})
}

func (s *Server) handleCreateKey(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !p.Admin {
		s.writeError(w, r, errdefs.New(errdefs.ErrPermissionDenied, "only an admin key may create keys"))
		return
	}
	var req struct {
		Tenant string `json:"tenant"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	id, key, err := s.keys.Create(r.Context(), req.Tenant, false)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": id, "key": key, "tenant": req.Tenant})
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	sub := s.sb.Subscribe(p.Tenant)
	defer sub.Close()
	sse := startSSE(w, http.StatusOK)
	defer sse.close()
	for {
		select {
		case <-r.Context().Done():
			return
		case e, ok := <-sub.C:
			if !ok {
				return
			}
			if !p.Admin {
				e.Reason = redactHostPaths(e.Reason)
			}
			if err := sse.send(e.Type, e); err != nil {
				return
			}
		}
	}
}

func (s *Server) handlePause(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	info, err := s.sb.Pause(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(info, p))
}

func (s *Server) handleResume(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	info, err := s.sb.Resume(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(info, p))
}

func (s *Server) handleFork(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Count *int `json:"count"`
	}
	if err := decodeOptionalJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	copies, err := s.sb.Fork(r.Context(), p.Tenant, r.PathValue("id"), count)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]sandboxJSON, 0, len(copies))
	for _, c := range copies {
		out = append(out, toJSON(c, p))
	}
	writeJSON(w, http.StatusCreated, map[string]any{"sandboxes": out})
}
