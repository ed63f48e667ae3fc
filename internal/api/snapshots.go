package api

import (
	"net/http"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/snapshot"
)

func (s *Server) handleCreateSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Kind  string `json:"kind"`
		Label string `json:"label"`
	}
	if err := decodeOptionalJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	snap, err := s.sb.Snapshot(r.Context(), p.Tenant, r.PathValue("id"), snapshot.Request{Kind: req.Kind, Label: req.Label})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snap)
}

func (s *Server) handleListSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	list, err := s.sb.Snapshots(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"snapshots": list})
}

func (s *Server) handleAllSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	list, err := s.sb.AllSnapshots(r.Context(), p.Tenant)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"snapshots": list})
}

func (s *Server) handleGetSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	snap, err := s.sb.GetSnapshot(r.Context(), p.Tenant, r.PathValue("sid"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

func (s *Server) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := s.sb.DeleteSnapshot(r.Context(), p.Tenant, r.PathValue("sid")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleDiff(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	against := r.URL.Query().Get("against")
	if against == "" {
		s.writeError(w, r, errdefs.InvalidArgument("against: the snapshot to compare with is required"))
		return
	}
	if err := snapshotRefError(against); err != nil {
		s.writeError(w, r, err)
		return
	}
	changes, err := s.sb.Diff(r.Context(), p.Tenant, r.PathValue("sid"), against)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"changes": changes})
}

func (s *Server) handleRestore(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		SnapshotID string   `json:"snapshot_id"`
		Paths      []string `json:"paths"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.SnapshotID == "" {
		s.writeError(w, r, errdefs.InvalidArgument("snapshot_id is required"))
		return
	}
	if err := snapshotRefError(req.SnapshotID); err != nil {
		s.writeError(w, r, err)
		return
	}
	info, err := s.sb.Restore(r.Context(), p.Tenant, r.PathValue("id"), req.SnapshotID, req.Paths)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(info, p))
}

func (s *Server) handleLineage(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	nodes, err := s.sb.Lineage(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"nodes": nodes})
}
