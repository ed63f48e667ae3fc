// Package confine is the one door through which host code touches a directory tree that a
// sandbox or an image wrote: writable layers, shared, fork and snapshot layers, checkpoint
// directories, template build layers, imported image layers, restore sources and targets.
//
// A Root is such a tree, opened once by a path the host chose. Every path beneath it is resolved
// by file descriptors with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|
// RESOLVE_NO_XDEV): a symbolic link anywhere on the way fails the call instead of being
// followed, so no path leaves the tree whatever its links say, even while the tree changes.
// Content is read only from regular files, opened by descriptor and checked on that descriptor
// (never a stat by name followed by an open by name). What it creates on the host is never a
// device node, fifo or socket (overlayfs whiteouts, 0:0 character devices, excepted) and never
// carries setuid or setgid bits or file capabilities. Paths are slash-separated and relative to
// the root ("" or "." is the root itself); any byte string but NUL is a valid name, and depth is
// not bounded by PATH_MAX.
//
// Any package may import it; `make lint` (internal/confine/lint) refuses direct os and
// path/filepath file-system calls in the packages that handle such trees.
package confine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Errors of the package, to be matched with errors.Is.
var (
	// ErrSymlink is returned when a path's resolution meets a symbolic link (or a magic link,
	// or a mount point) that it would have had to follow.
	ErrSymlink = errors.New("symbolic link on the path")
	// ErrNotRegular is returned when content is asked of something that is not a regular file.
	ErrNotRegular = errors.New("not a regular file")
	// ErrBadPath is returned for a path that is absolute, not clean, climbs with "..", or holds NUL.
	ErrBadPath = errors.New("bad path")
	// ErrRefused is returned when asked to create what the host must never hold (devices,
	// fifos, sockets).
	ErrRefused = errors.New("refused to materialise on the host")
)

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// segmentMax bounds the bytes of one openat2 path argument, well under PATH_MAX.
const segmentMax = 2048

// Root is an open tree. Its methods are safe for concurrent use; Close ends them.
type Root struct {
	fd   int
	name string // for messages only
}

// Open opens the directory dir, a path the host chose (its last component must not be a
// symbolic link), as a Root.
func Open(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathErr("open", dir, err)
	}
	return &Root{fd: fd, name: dir}, nil
}

// Close releases the root.
func (r *Root) Close() error { return unix.Close(r.fd) }

// Name is the host path the root was opened by (for messages).
func (r *Root) Name() string { return r.name }

// Clean checks p and returns it in canonical form: "" for the root, else a clean relative path.
func Clean(p string) (string, error) {
	if p == "" || p == "." {
		return "", nil
	}
	if strings.IndexByte(p, 0) >= 0 || strings.HasPrefix(p, "/") || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("%w: %q", ErrBadPath, p)
	}
	return p, nil
}

func (r *Root) errorf(op, p string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		err = fmt.Errorf("%w (%v)", ErrSymlink, err)
	}
	return &fs.PathError{Op: op, Path: r.name + "/" + p, Err: err}
}

func pathErr(op, p string, err error) error { return &fs.PathError{Op: op, Path: p, Err: err} }

// walkTo opens the directory p beneath the root with flags (O_PATH or O_RDONLY, plus
// O_DIRECTORY), resolving it in segments so that its length is not bounded by PATH_MAX.
func (r *Root) walkTo(p string, flags uint64) (int, error) {
	cur := r.fd
	owned := false
	rest := p
	for {
		seg := rest
		if len(seg) > segmentMax {
			i := strings.LastIndexByte(seg[:segmentMax], '/')
			if i <= 0 {
				if owned {
					unix.Close(cur)
				}
				return -1, unix.ENAMETOOLONG
			}
			seg = seg[:i]
		}
		rest = strings.TrimPrefix(strings.TrimPrefix(rest, seg), "/")
		if seg == "" {
			seg = "."
		}
		how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags}
		if rest == "" {
			how.Flags = flags | unix.O_DIRECTORY | unix.O_CLOEXEC
		}
		fd, err := openat2(cur, seg, how)
		if owned {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		cur, owned = fd, true
		if rest == "" {
			return cur, nil
		}
	}
}

func openat2(dirfd int, p string, how *unix.OpenHow) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, p, how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// parent opens the directory holding p and returns it with p's last component. p must not be
// the root.
func (r *Root) parent(op, p string) (*Dir, string, error) {
	c, err := Clean(p)
	if err != nil {
		return nil, "", &fs.PathError{Op: op, Path: p, Err: err}
	}
	if c == "" {
		return nil, "", &fs.PathError{Op: op, Path: p, Err: fmt.Errorf("%w: the root itself", ErrBadPath)}
	}
	dir, base := path.Split(c)
	d, err := r.OpenDir(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return nil, "", err
	}
	return d, base, nil
}

// OpenDir opens the directory p for reading and for calls relative to it.
func (r *Root) OpenDir(p string) (*Dir, error) {
	c, err := Clean(p)
	if err != nil {
		return nil, &fs.PathError{Op: "opendir", Path: p, Err: err}
	}
	fd, err := r.walkTo(c, unix.O_RDONLY)
	if err != nil {
		return nil, r.errorf("opendir", c, err)
	}
	return &Dir{fd: fd, root: r, path: c}, nil
}

// Lstat describes p without following it.
func (r *Root) Lstat(p string) (Info, error) {
	c, err := Clean(p)
	if err != nil {
		return Info{}, &fs.PathError{Op: "lstat", Path: p, Err: err}
	}
	if c == "" {
		var st unix.Stat_t
		if err := unix.Fstat(r.fd, &st); err != nil {
			return Info{}, r.errorf("lstat", c, err)
		}
		return infoOf(&st), nil
	}
	d, base, err := r.parent("lstat", c)
	if err != nil {
		return Info{}, err
	}
	defer d.Close()
	return d.Lstat(base)
}

// Open opens the regular file p for reading; anything else fails with ErrNotRegular.
func (r *Root) Open(p string) (*os.File, Info, error) {
	d, base, err := r.parent("open", p)
	if err != nil {
		return nil, Info{}, err
	}
	defer d.Close()
	return d.Open(base)
}

// ReadFile returns the content of the regular file p, at most limit bytes (more is an error).
func (r *Root) ReadFile(p string, limit int64) ([]byte, error) {
	f, info, err := r.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info.Size > limit {
		return nil, r.errorf("read", p, fmt.Errorf("larger than %d bytes", limit))
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, r.errorf("read", p, err)
	}
	if int64(len(b)) > limit {
		return nil, r.errorf("read", p, fmt.Errorf("larger than %d bytes", limit))
	}
	return b, nil
}

// Readlink returns the target of the symbolic link p (never followed).
func (r *Root) Readlink(p string) (string, error) {
	d, base, err := r.parent("readlink", p)
	if err != nil {
		return "", err
	}
	defer d.Close()
	return d.Readlink(base)
}

// ReadDir lists the directory p, sorted by name, with each entry described without following it.
func (r *Root) ReadDir(p string) ([]DirEntry, error) {
	d, err := r.OpenDir(p)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.ReadDir()
}

// Xattrs returns p's extended attributes (not following p).
func (r *Root) Xattrs(p string) (map[string][]byte, error) {
	if c, err := Clean(p); err == nil && c == "" {
		return fdXattrs(r.fd, r.name)
	}
	d, base, err := r.parent("listxattr", p)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Xattrs(base)
}

// Mkdir makes the directory p (mode without setuid/setgid; umask applies).
func (r *Root) Mkdir(p string, mode uint32) error {
	d, base, err := r.parent("mkdir", p)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Mkdir(base, mode)
}

// MkdirAll makes p and any missing parent, never through a symbolic link.
func (r *Root) MkdirAll(p string, mode uint32) error {
	c, err := Clean(p)
	if err != nil {
		return &fs.PathError{Op: "mkdir", Path: p, Err: err}
	}
	if c == "" {
		return nil
	}
	d, err := r.OpenDir("")
	if err != nil {
		return err
	}
	for _, name := range strings.Split(c, "/") {
		err := d.Mkdir(name, mode)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			d.Close()
			return err
		}
		next, err := d.OpenDir(name)
		d.Close()
		if err != nil {
			return err
		}
		d = next
	}
	return d.Close()
}

// Create makes the new regular file p (it must not exist) and opens it for writing.
func (r *Root) Create(p string, mode uint32) (*os.File, error) {
	d, base, err := r.parent("create", p)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Create(base, mode)
}

// Symlink makes p a symbolic link to target. The target is stored as given and never resolved
// by this package.
func (r *Root) Symlink(target, p string) error {
	d, base, err := r.parent("symlink", p)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Symlink(target, base)
}

// Link makes newp a hard link to the regular file oldp, both beneath the root.
func (r *Root) Link(oldp, newp string) error {
	od, obase, err := r.parent("link", oldp)
	if err != nil {
		return err
	}
	defer od.Close()
	info, err := od.Lstat(obase)
	if err != nil {
		return err
	}
	if !info.IsRegular() {
		return r.errorf("link", oldp, ErrNotRegular)
	}
	nd, nbase, err := r.parent("link", newp)
	if err != nil {
		return err
	}
	defer nd.Close()
	if err := unix.Linkat(od.fd, obase, nd.fd, nbase, 0); err != nil {
		return r.errorf("link", newp, err)
	}
	return nil
}

// Whiteout makes p an overlayfs whiteout (a 0:0 character device).
func (r *Root) Whiteout(p string) error {
	d, base, err := r.parent("whiteout", p)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Whiteout(base)
}

// SetMeta gives p the owner, mode (less setuid and setgid), times and safe extended
// attributes of m, without following p.
func (r *Root) SetMeta(p string, m Meta) error {
	if c, err := Clean(p); err == nil && c == "" {
		d, err := r.OpenDir("")
		if err != nil {
			return err
		}
		defer d.Close()
		return d.setMetaSelf(m)
	}
	d, base, err := r.parent("setmeta", p)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.SetMeta(base, m)
}

// Remove removes p (a directory only if empty).
func (r *Root) Remove(p string) error {
	d, base, err := r.parent("remove", p)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Remove(base)
}

// RemoveAll removes p and everything beneath it; a missing p is not an error.
func (r *Root) RemoveAll(p string) error {
	d, base, err := r.parent("removeall", p)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.Close()
	return d.RemoveAll(base)
}

// Walk calls fn for p and everything beneath it, parents before children, names sorted. fn
// may return fs.SkipDir for a directory to skip its content. Entries are found by descriptor
// relative to their parent, so the walk never leaves the tree and has no depth limit.
func (r *Root) Walk(p string, fn WalkFunc) error {
	c, err := Clean(p)
	if err != nil {
		return &fs.PathError{Op: "walk", Path: p, Err: err}
	}
	var info Info
	var d *Dir
	if c == "" {
		d, err = r.OpenDir("")
		if err != nil {
			return err
		}
		defer d.Close()
		if info, err = r.Lstat(""); err != nil {
			return err
		}
		if err := fn(Entry{Path: "", Info: info, dir: d, name: "."}); err != nil {
			if errors.Is(err, fs.SkipDir) {
				return nil
			}
			return err
		}
		return walkDir(d, "", fn)
	}
	parent, base, err := r.parent("walk", c)
	if err != nil {
		return err
	}
	defer parent.Close()
	if info, err = parent.Lstat(base); err != nil {
		return err
	}
	if err := walkEntry(parent, c, base, info, fn); !errors.Is(err, fs.SkipDir) {
		return err
	}
	return nil
}

// WalkFunc is called by Walk for each entry.
type WalkFunc func(e Entry) error

func walkEntry(parent *Dir, p, name string, info Info, fn WalkFunc) error {
	err := fn(Entry{Path: p, Info: info, dir: parent, name: name})
	if !info.IsDir() {
		return err
	}
	if errors.Is(err, fs.SkipDir) {
		return nil
	}
	if err != nil {
		return err
	}
	d, err := parent.OpenDir(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed while we walked
	}
	if err != nil {
		return err
	}
	defer d.Close()
	return walkDir(d, p, fn)
}

func walkDir(d *Dir, p string, fn WalkFunc) error {
	entries, err := d.ReadDir()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := walkEntry(d, join(p, e.Name), e.Name, e.Info, fn); errors.Is(err, fs.SkipDir) {
			return nil // SkipDir for a file skips the rest of its directory
		} else if err != nil {
			return err
		}
	}
	return nil
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// Entry is what Walk reports: a path, its description, and calls on it that go through its
// parent's descriptor.
type Entry struct {
	Path string // relative to the root; "" for the root
	Info Info
	dir  *Dir
	name string
}

// Open opens the entry's content (regular files only), checking that it is still the file the
// walk described.
func (e Entry) Open() (*os.File, Info, error) {
	if e.Path == "" {
		return nil, Info{}, e.dir.root.errorf("open", "", ErrNotRegular)
	}
	return e.dir.Open(e.name)
}

// Readlink returns the entry's link target.
func (e Entry) Readlink() (string, error) { return e.dir.Readlink(e.name) }

// Xattrs returns the entry's extended attributes.
func (e Entry) Xattrs() (map[string][]byte, error) {
	if e.Path == "" {
		return fdXattrs(e.dir.fd, e.dir.root.name)
	}
	return e.dir.Xattrs(e.name)
}

// procPath names fd's file through /proc/self/fd, for calls that take only a path; the kernel
// resolves it to the very file the descriptor holds.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }
