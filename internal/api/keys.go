package api

import (
	"net/http"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
)

// keyJSON describes a stored key; the key itself is never stored, so never returned.
type keyJSON struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Admin     bool      `json:"admin"`
	CreatedAt time.Time `json:"created_at"`
}

func requireAdmin(p auth.Principal, what string) error {
	if !p.Admin {
		return errdefs.New(errdefs.ErrPermissionDenied, "only an admin key may "+what)
	}
	return nil
}

func (s *Server) handleListKeys(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p, "list keys"); err != nil {
		s.writeError(w, r, err)
		return
	}
	keys, err := s.keys.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]keyJSON, 0, len(keys))
	for _, k := range keys {
		out = append(out, keyJSON{ID: k.ID, Tenant: k.Tenant, Admin: k.Admin, CreatedAt: k.CreatedAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": out})
}

// handleRevokeKey deletes a tenant's key: its next request is 401 and requests still running
// under it (event streams, proxied connections) end at once. Admin keys are not revoked here:
// revoking the only one would leave nobody able to make keys; changing SPACE_ADMIN_KEY and
// restarting retires the old one.
func (s *Server) handleRevokeKey(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p, "revoke keys"); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	keys, err := s.keys.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	found := false
	for _, k := range keys {
		if k.ID != id {
			continue
		}
		found = true
		if k.Admin {
			s.writeError(w, r, errdefs.Conflict("key "+id+" is an admin key: change SPACE_ADMIN_KEY and restart spaced to retire it"))
			return
		}
	}
	if !found {
		s.writeError(w, r, errdefs.NotFound("key "+id+" not found"))
		return
	}
	if err := s.keys.Revoke(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
