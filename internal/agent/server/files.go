package server

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
)

// filesHandler serves GET and POST /files as envd does (E2B-WIRE.md section 3). Bodies stream
// both ways: an upload goes to a temporary file in the target's directory and is renamed into
// place once complete, so readers never see a partial file and memory stays flat.
type filesHandler struct{ s *Server }

// fileEntry is one element of the POST /files response.
type fileEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

func (h *filesHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		h.get(w, r)
	case http.MethodPost, http.MethodPut:
		h.post(w, r)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST, PUT")
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

func (h *filesHandler) user(r *http.Request) (User, error) {
	name := r.URL.Query().Get("username")
	if name == "" {
		name = preferredDefault(h.s.users, r.Header, h.s.cfg.DefaultUser)
	}
	return h.s.users.lookup(name)
}

func (h *filesHandler) get(w http.ResponseWriter, r *http.Request) {
	u, err := h.user(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	p, err := resolvePath(u, r.URL.Query().Get("path"))
	if err != nil {
		writeErr(w, err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		writeErr(w, fsError(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeErr(w, fsError(err))
		return
	}
	if fi.IsDir() {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("path is a directory: %s", p))
		return
	}
	if !fi.Mode().IsRegular() {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("path is not a regular file: %s", p))
		return
	}
	ctype := mime.TypeByExtension(filepath.Ext(p))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(p)}))
	if fi.Size() > 0 {
		http.ServeContent(w, r, "", fi.ModTime(), f) // sets Content-Length, honours Range
		return
	}
	// Size 0: really empty, or synthetic (/proc, /sys) with content of unknown length.
	var first [1]byte
	n, _ := f.Read(first[:])
	if n == 0 {
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(first[:n])
	_, _ = io.Copy(w, f)
}

func (h *filesHandler) post(w http.ResponseWriter, r *http.Request) {
	u, err := h.user(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	q := r.URL.Query()
	mode, modeSet, err := parseMode(q.Get("mode"))
	if err != nil {
		writeErr(w, err)
		return
	}
	body := io.Reader(r.Body)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, "invalid gzip body: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	default:
		writeJSONError(w, http.StatusUnsupportedMediaType, "unsupported content encoding "+enc)
		return
	}
	var entries []fileEntry
	ctype, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ctype == "multipart/form-data" {
		entries, err = h.postMultipart(u, q.Get("path"), multipart.NewReader(body, params["boundary"]), mode, modeSet)
	} else {
		var e fileEntry
		e, err = h.writeFile(u, q.Get("path"), body, mode, modeSet)
		entries = []fileEntry{e}
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(entries)
}

func (h *filesHandler) postMultipart(u User, queryPath string, mr *multipart.Reader, mode fs.FileMode, modeSet bool) ([]fileEntry, error) {
	var entries []fileEntry
	for {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, errdefs.InvalidArgument("malformed multipart body: " + err.Error())
		}
		form, filename, ok := partNames(part.Header)
		if !ok || form != "file" {
			_ = part.Close()
			continue
		}
		target := queryPath
		if target == "" {
			target = filename
		}
		e, err := h.writeFile(u, target, part, mode, modeSet)
		_ = part.Close()
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		return nil, errdefs.InvalidArgument(`multipart body has no part named "file"`)
	}
	return entries, nil
}

// partNames returns the form field name and the raw filename of a multipart part. Unlike
// (*multipart.Part).FileName it keeps the whole path, which E2B clients put there.
func partNames(h textproto.MIMEHeader) (form, filename string, ok bool) {
	disp, params, err := mime.ParseMediaType(h.Get("Content-Disposition"))
	if err != nil || disp != "form-data" {
		return "", "", false
	}
	return params["name"], params["filename"], true
}

// parseMode parses an octal mode such as "0644" or "755" (at most 07777).
func parseMode(s string) (fs.FileMode, bool, error) {
	if s == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o7777 {
		return 0, false, errdefs.InvalidArgument(fmt.Sprintf("invalid mode %q: want octal, at most 07777", s))
	}
	m := fs.FileMode(n & 0o777)
	if n&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if n&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m, true, nil
}

// writeFile streams src into target (relative to u's home), creating parents owned by u. A
// symlink at target is written through. The file gets mode (if set), else the mode of the file
// it replaces, else 0644, and belongs to u.
func (h *filesHandler) writeFile(u User, target string, src io.Reader, mode fs.FileMode, modeSet bool) (fileEntry, error) {
	p, err := resolvePath(u, target)
	if err != nil {
		return fileEntry{}, err
	}
	real, perm := p, fs.FileMode(0o644)
	if fi, err := os.Lstat(p); err == nil {
		if fi.Mode()&fs.ModeSymlink != 0 {
			if t, err := filepath.EvalSymlinks(p); err == nil {
				real = t
				fi, _ = os.Stat(t)
			} else {
				fi = nil // dangling: replace the link itself
			}
		}
		if fi != nil {
			if fi.IsDir() {
				return fileEntry{}, errdefs.InvalidArgument(fmt.Sprintf("path is a directory: %s", p))
			}
			if !fi.Mode().IsRegular() {
				return fileEntry{}, errdefs.InvalidArgument(fmt.Sprintf("path is not a regular file: %s", p))
			}
			perm = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fileEntry{}, fsError(err)
	}
	if modeSet {
		perm = mode
	}
	dir := filepath.Dir(real)
	if err := mkdirAllOwned(dir, u); err != nil {
		return fileEntry{}, err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(real)+".upload-*")
	if err != nil {
		return fileEntry{}, fsError(err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	buf := make([]byte, 256<<10)
	if _, err := io.CopyBuffer(tmp, src, buf); err != nil {
		return fileEntry{}, fmt.Errorf("write %s: %w", p, classifyCopyErr(err))
	}
	if err := tmp.Chmod(perm); err != nil {
		return fileEntry{}, fsError(err)
	}
	if canChown(u) {
		if err := tmp.Chown(int(u.UID), int(u.GID)); err != nil {
			return fileEntry{}, fsError(err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fileEntry{}, fsError(err)
	}
	if err := os.Rename(tmp.Name(), real); err != nil {
		return fileEntry{}, fsError(err)
	}
	committed = true
	return fileEntry{Name: filepath.Base(p), Type: "file", Path: p}, nil
}

// classifyCopyErr separates a full disk (the agent's fault) from a broken upload (the client's).
func classifyCopyErr(err error) error {
	if c := fsError(err); errors.Is(c, errdefs.ErrResourceExhausted) {
		return c
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return errdefs.InvalidArgument("reading request body: " + err.Error())
}

// httpStatus maps an error class to the status /files answers with.
func httpStatus(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

func writeErr(w http.ResponseWriter, err error) {
	writeJSONError(w, httpStatus(err), err.Error())
}

// writeJSONError writes envd's error body {"code": <status>, "message": "..."}.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}
