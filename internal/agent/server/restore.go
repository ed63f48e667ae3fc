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
	"time"

	"golang.org/x/sys/unix"
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

// extract writes the tar stream's entries, each at or under one of roots. Entries are made
// relative to their parent directory's descriptor, held on a stack along the current path, so
// that a tree of any depth (past PATH_MAX) comes back: a tar of a tree lists parents first.
func extract(tr *tar.Reader, roots []string) (int, error) {
	n := 0
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirs []dirTime
	st := &dirStack{}
	defer st.close()
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
		dfd, err := st.open(path.Dir(p))
		if err != nil {
			return n, err
		}
		name := path.Base(p)
		mode := uint32(hdr.Mode & 0o777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := unix.Mkdirat(dfd, name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
				return n, pathError("mkdir", p, err)
			}
			dirs = append(dirs, dirTime{p, hdr.ModTime})
		case tar.TypeReg:
			fd, err := unix.Openat(dfd, name, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_CLOEXEC, mode)
			if err != nil {
				return n, pathError("create", p, err)
			}
			f := os.NewFile(uintptr(fd), p)
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return n, err
			}
		case tar.TypeSymlink:
			if err := unix.Symlinkat(hdr.Linkname, dfd, name); err != nil {
				return n, pathError("symlink", p, err)
			}
		case tar.TypeFifo:
			if err := unix.Mkfifoat(dfd, name, mode); err != nil {
				return n, pathError("mkfifo", p, err)
			}
		default:
			continue
		}
		if err := unix.Fchownat(dfd, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EPERM) {
			return n, pathError("chown", p, err)
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// chown clears setuid bits: the full mode goes last.
			if err := unix.Fchmodat(dfd, name, uint32(hdr.Mode&0o7777), 0); err != nil {
				return n, pathError("chmod", p, err)
			}
			if hdr.Typeflag != tar.TypeDir {
				if err := setTimes(dfd, name, hdr.ModTime); err != nil {
					return n, pathError("utimes", p, err)
				}
			}
		}
		n++
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if dfd, err := st.open(path.Dir(dirs[i].path)); err == nil {
			_ = setTimes(dfd, path.Base(dirs[i].path), dirs[i].t)
		}
	}
	return n, nil
}

func setTimes(dfd int, name string, t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(dfd, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

func pathError(op, p string, err error) error { return &os.PathError{Op: op, Path: p, Err: err} }

// dirStack holds open descriptors of the directories along one path from /, so that the next
// entry's parent is reached from the deepest one they share: one open per new directory.
type dirStack struct {
	paths []string // clean absolute paths, each the parent of the next
	fds   []int
}

// open returns a descriptor of directory dir (absolute, clean), making missing directories.
// It stays valid until the next call.
func (s *dirStack) open(dir string) (int, error) {
	if len(s.fds) == 0 {
		fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, pathError("open", "/", err)
		}
		s.paths, s.fds = []string{"/"}, []int{fd}
	}
	for {
		top := s.paths[len(s.paths)-1]
		if top == dir || top == "/" || strings.HasPrefix(dir, top+"/") {
			break
		}
		unix.Close(s.fds[len(s.fds)-1])
		s.paths, s.fds = s.paths[:len(s.paths)-1], s.fds[:len(s.fds)-1]
	}
	top := s.paths[len(s.paths)-1]
	rest := strings.TrimPrefix(strings.TrimPrefix(dir, top), "/")
	if rest == "" {
		return s.fds[len(s.fds)-1], nil
	}
	for c := range strings.SplitSeq(rest, "/") {
		parent := s.fds[len(s.fds)-1]
		if err := unix.Mkdirat(parent, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, pathError("mkdir", path.Join(top, c), err)
		}
		fd, err := unix.Openat(parent, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, pathError("open", path.Join(top, c), err)
		}
		top = path.Join(top, c)
		s.paths, s.fds = append(s.paths, top), append(s.fds, fd)
	}
	return s.fds[len(s.fds)-1], nil
}

func (s *dirStack) close() {
	for _, fd := range s.fds {
		unix.Close(fd)
	}
}
