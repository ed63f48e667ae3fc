package server

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strings"
	"syscall"
	"time"
)

// restoreHandler serves POST /restore?path=…: every path named is removed, then the tar stream
// in the body (names relative to /, each at or under one of the paths) is written in its place.
// spaced uses it to put files of a snapshot back while the sandbox's processes keep running.
type restoreHandler struct{ s *Server }

func (h *restoreHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	paths := r.URL.Query()["path"]
	if len(paths) == 0 {
		writeJSONError(w, http.StatusBadRequest, "at least one path is required")
		return
	}
	for i, p := range paths {
		if !path.IsAbs(p) || path.Clean(p) == "/" || strings.ContainsRune(p, 0) {
			writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("path %q: want an absolute path below /", p))
			return
		}
		paths[i] = path.Clean(p)
	}
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			writeJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	n, err := extract(tar.NewReader(r.Body), paths)
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, fmt.Sprintf("restore: %v (after %d entries)", err, n))
		return
	}
	h.s.log.Info("restored paths", "paths", paths, "entries", n)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"entries":%d}`, n)
}

// under reports whether p is one of roots or inside one.
func under(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

func extract(tr *tar.Reader, roots []string) (int, error) {
	n := 0
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, err
		}
		p := path.Clean("/" + hdr.Name)
		if !under(p, roots) {
			return n, fmt.Errorf("entry %q is outside the paths being restored", hdr.Name)
		}
		if err := os.MkdirAll(path.Dir(p), 0o755); err != nil {
			return n, err
		}
		mode := os.FileMode(hdr.Mode & 0o777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, mode); err != nil && !errors.Is(err, os.ErrExist) {
				return n, err
			}
			dirs = append(dirs, dirTime{p, hdr.ModTime})
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
			if err != nil {
				return n, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return n, err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				return n, err
			}
		case tar.TypeFifo:
			if err := syscall.Mkfifo(p, uint32(mode)); err != nil {
				return n, err
			}
		default:
			continue
		}
		if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil && !errors.Is(err, os.ErrPermission) {
			return n, err
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// chown clears setuid bits: the full mode goes last.
			if err := syscall.Chmod(p, uint32(hdr.Mode&0o7777)); err != nil {
				return n, err
			}
			if hdr.Typeflag != tar.TypeDir {
				if err := os.Chtimes(p, hdr.ModTime, hdr.ModTime); err != nil {
					return n, err
				}
			}
		}
		n++
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Chtimes(dirs[i].path, dirs[i].t, dirs[i].t)
	}
	return n, nil
}
