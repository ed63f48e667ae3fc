package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
)

// queryPath reads and validates the `path` query parameter.
func queryPath(r *http.Request) (string, error) {
	q := r.URL.Query()
	if len(q["path"]) != 1 {
		return "", errdefs.InvalidArgument("path: give it exactly once")
	}
	return cleanPath("path", q.Get("path"))
}

func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	path, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var mode os.FileMode
	if m := r.URL.Query().Get("mode"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o7777 {
			s.writeError(w, r, errdefs.InvalidArgument(fmt.Sprintf("mode %q: want octal permissions such as 0644", m)))
			return
		}
		mode = os.FileMode(n)
	}
	if path == "/" {
		s.writeError(w, r, errdefs.InvalidArgument("path: / is a directory"))
		return
	}
	if r.ContentLength > s.maxUp {
		s.writeError(w, r, errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("file is larger than the %d-byte limit", s.maxUp)))
		return
	}
	c, ctx, release, err := s.sb.Agent(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	body := http.MaxBytesReader(w, r.Body, s.maxUp)
	e, err := c.Upload(ctx, path, mode, "", body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("file is larger than the %d-byte limit", s.maxUp))
		}
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"path": path, "size": e.Size})
}

func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	path, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	c, ctx, release, err := s.sb.Agent(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	rc, size, err := c.Download(ctx, path, "")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Debug("download interrupted", "path", path, "err", err)
	}
}

func (s *Server) handleRemove(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	path, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	recursive := false
	if v := r.URL.Query().Get("recursive"); v != "" {
		if recursive, err = strconv.ParseBool(v); err != nil {
			s.writeError(w, r, errdefs.InvalidArgument("recursive: want true or false"))
			return
		}
	}
	if path == "/" {
		s.writeError(w, r, errdefs.InvalidArgument("path: refusing to remove /"))
		return
	}
	c, ctx, release, err := s.sb.Agent(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	if err := c.Remove(ctx, path, recursive); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type entryJSON struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"`
	ModifiedAt time.Time `json:"modified_at"`
	Target     string    `json:"symlink_target,omitempty"`
}

func toEntry(e agent.Entry) entryJSON {
	return entryJSON{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size,
		Mode:       unixPerm(e.Mode),
		ModifiedAt: e.ModifiedAt.UTC(), Target: e.SymlinkTarget}
}

func (s *Server) handleListDir(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	path, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	c, ctx, release, err := s.sb.Agent(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	list, err := c.ListDir(ctx, path, 1)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]entryJSON, 0, len(list))
	for _, e := range list {
		out = append(out, toEntry(e))
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out})
}

func (s *Server) handleMkdir(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Path string `json:"path"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	path, err := cleanPath("path", req.Path)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	c, ctx, release, err := s.sb.Agent(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	e, err := c.MakeDir(ctx, path)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toEntry(e))
}

func (s *Server) handleMove(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	from, err := cleanPath("from", req.From)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	to, err := cleanPath("to", req.To)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if from == "/" || to == "/" {
		s.writeError(w, r, errdefs.InvalidArgument("move: / cannot be moved or replaced"))
		return
	}
	c, ctx, release, err := s.sb.Agent(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	e, err := c.Move(ctx, from, to)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toEntry(e))
}

func (s *Server) handleWatch(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	path, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	recursive := false
	if v := r.URL.Query().Get("recursive"); v != "" {
		if recursive, err = strconv.ParseBool(v); err != nil {
			s.writeError(w, r, errdefs.InvalidArgument("recursive: want true or false"))
			return
		}
	}
	c, ctx, release, err := s.sb.Agent(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	ws, err := c.Watch(ctx, path, recursive)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	sse := startSSE(w, http.StatusOK)
	defer sse.close()
	for {
		ev, err := ws.Recv()
		if err != nil {
			if r.Context().Err() == nil && !errors.Is(err, io.EOF) {
				if cause := context.Cause(ctx); cause != nil && r.Context().Err() == nil {
					err = cause
				}
				status, code := statusOf(err)
				_ = sse.send("error", errorDetail{Code: code, Message: messageOf(err, status)})
			}
			return
		}
		full := path + "/" + ev.Name
		if path == "/" {
			full = "/" + ev.Name
		}
		if sse.send("change", map[string]string{"path": full, "op": ev.Op}) != nil {
			return
		}
	}
}

// unixPerm is a mode's permission bits in unix form (e.g. 0644, 04755).
func unixPerm(m os.FileMode) uint32 {
	perm := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		perm |= 0o1000
	}
	return perm
}
