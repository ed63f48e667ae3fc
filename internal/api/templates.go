package api

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/template/build"
)

type templateJSON struct {
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	Parent    string    `json:"parent,omitempty"`
}

// toTemplateJSON describes t to p. A parent naming a host path (an image from a docker-archive
// file or an OCI layout on the host) is the host's business: tenants see only its kind.
func toTemplateJSON(t build.TemplateInfo, p auth.Principal) templateJSON {
	parent := t.Parent
	if !p.Admin {
		for _, scheme := range []string{"docker-archive:", "oci:"} {
			if strings.HasPrefix(parent, scheme) {
				parent = scheme
			}
		}
	}
	return templateJSON{Name: t.Name, SizeBytes: t.SizeBytes, CreatedAt: t.CreatedAt, Parent: parent}
}

func (s *Server) handleListTemplates(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	list, err := s.tpl.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]templateJSON, 0, len(list))
	for _, t := range list {
		out = append(out, toTemplateJSON(t, p))
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": out})
}

func (s *Server) handleDeleteTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !p.Admin {
		s.writeError(w, r, errdefs.New(errdefs.ErrPermissionDenied, "only an admin key may delete templates"))
		return
	}
	if err := s.tpl.Delete(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleBuildTemplate builds a template; with Accept: text/event-stream it streams the build log
// (`log`, then `done` or `error`).
func (s *Server) handleBuildTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !p.Admin {
		s.writeError(w, r, errdefs.New(errdefs.ErrPermissionDenied, "only an admin key may build templates"))
		return
	}
	var req build.Request
	if err := decodeJSONLimit(w, r, &req, 16<<20); err != nil {
		s.writeError(w, r, err)
		return
	}
	if !wantsSSE(r) {
		t, err := s.tpl.Build(r.Context(), req, func(line string) { s.log.Info("template build", "template", req.Name, "log", line) })
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusCreated, toTemplateJSON(t, p))
		return
	}
	sse := startSSE(w, http.StatusOK)
	defer sse.close()
	var mu sync.Mutex
	t, err := s.tpl.Build(r.Context(), req, func(line string) {
		mu.Lock()
		defer mu.Unlock()
		_ = sse.send("log", map[string]string{"message": line})
	})
	if err != nil {
		status, code := statusOf(err)
		_ = sse.send("error", errorDetail{Code: code, Message: messageOf(err, status)})
		return
	}
	_ = sse.send("done", toTemplateJSON(t, p))
}
