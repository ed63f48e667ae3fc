package api

import (
	"net/http"
	"strconv"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/e2b"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/egress/credentials"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
)

func (s *Server) handleUpdateNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Egress *sandbox.Egress `json:"egress"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	var e sandbox.Egress
	if req.Egress != nil {
		e = *req.Egress
	}
	info, err := s.sb.UpdateNetwork(r.Context(), p.Tenant, r.PathValue("id"), e)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(info, p))
}

// handleEgress returns a sandbox's recent egress decisions, or streams new ones (SSE, event
// "egress") when the client accepts text/event-stream.
func (s *Server) handleEgress(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("id")
	if !wantsSSE(r) {
		events, err := s.sb.EgressEvents(p.Tenant, id)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if events == nil {
			events = []egress.Event{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"events": events})
		return
	}
	c, cancel, err := s.sb.SubscribeEgress(p.Tenant, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer cancel()
	sse := startSSE(w, http.StatusOK)
	defer sse.close()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev := <-c:
			if sse.send("egress", ev) != nil {
				return
			}
		}
	}
}

func (s *Server) handlePutSecret(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Value  string   `json:"value"`
		Hosts  []string `json:"hosts"`
		Header string   `json:"header"`
		Format string   `json:"format"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	err := s.secrets.Put(r.Context(), p.Tenant, r.PathValue("name"), credentials.Request{
		Value: req.Value, Hosts: req.Hosts, Header: req.Header, Format: req.Format,
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleListSecrets(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	list, err := s.secrets.List(r.Context(), p.Tenant)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"secrets": list})
}

func (s *Server) handleDeleteSecret(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := s.secrets.Delete(r.Context(), p.Tenant, r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handlePort forwards a request to a port a process in the sandbox listens on:
// /v1/sandboxes/{id}/ports/{port}/{path...} → http://<sandbox>:<port>/{path...}. spaced's own
// credentials are not passed on.
func (s *Server) handlePort(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		s.writeError(w, r, errdefs.InvalidArgument("port: not a number"))
		return
	}
	t, err := s.sb.Port(p.Tenant, r.PathValue("id"), port, nil) // the API key authorised it: the tenant's own sandbox
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = "/"+r.PathValue("path"), ""
	e2b.Forward(w, r2, t.URL, t.Transport, t.Life, s.log, "Authorization", "X-API-Key")
}
