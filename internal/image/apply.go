package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/errdefs"
)

// Whiteout names of the OCI image spec (inherited from AUFS).
const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// applier applies layer tarballs, one after another, to the tree under root.
//
// Every path is resolved through os.Root, which walks each component beneath the root (with
// openat2 RESOLVE_BENEATH where the kernel has it) and fails when a ".." or a symlink — absolute,
// or relative but climbing out — would leave it. Final components are never followed: an entry
// replaces whatever is there (a directory meeting a directory is merged), files are created with
// O_EXCL, and metadata of the final component is set with *at calls that do not follow it. So no
// entry, whatever earlier entries planted, can create, change or delete anything outside root.
type applier struct {
	root    *os.Root
	log     *slog.Logger
	chown   bool // cleared when chown fails with EPERM (not root): ownership is then dropped
	skipped int  // device nodes and fifos skipped
	// limit bounds the bytes of file data the image may put on the host disk (holes are
	// written as holes and do not count); 0 means DefaultMaxBytes.
	limit   int64
	written int64
}

// DefaultMaxBytes is the most file data one image may unpack to (holes excepted).
const DefaultMaxBytes = 32 << 30

// layerState is what one layer's application remembers.
type layerState struct {
	seen map[string]bool        // paths this layer wrote, and their ancestors: opaque whiteouts keep them
	dirs map[string]*tar.Header // directories whose mode and times are set when the layer ends
}

// refusal is an entry refused for safety; it becomes errdefs.ErrInvalidArgument.
type refusal struct{ reason string }

func (r *refusal) Error() string { return r.reason }

// escapes reports whether err is os.Root refusing a path that leaves the root. The standard
// library does not export that error, so its text is matched; the tests catch a change.
func escapes(err error) bool {
	return err != nil && strings.Contains(err.Error(), "path escapes from parent")
}

// applyLayer applies one uncompressed layer tarball.
func (a *applier) applyLayer(ctx context.Context, r io.Reader) error {
	tr := tar.NewReader(r)
	st := &layerState{seen: map[string]bool{}, dirs: map[string]*tar.Header{}}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errdefs.InvalidArgument(fmt.Sprintf("corrupt layer tarball: %v", err))
		}
		if err := a.applyEntry(hdr, tr, st); err != nil {
			var rf *refusal
			if errors.As(err, &rf) || escapes(err) {
				return errdefs.InvalidArgument(fmt.Sprintf("refused layer entry %q: %v", hdr.Name, err))
			}
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	return a.finishDirs(st)
}

// cleanName turns a tar name into a clean path relative to the root, refusing absolute names
// and names that climb out of it.
func cleanName(name string) (string, error) {
	switch {
	case name == "":
		return "", &refusal{"empty name"}
	case path.IsAbs(name):
		return "", &refusal{"absolute name"}
	case strings.IndexByte(name, 0) >= 0:
		return "", &refusal{"name contains NUL"}
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", &refusal{"name leads out of the root"}
	}
	return c, nil
}

func (a *applier) applyEntry(hdr *tar.Header, r io.Reader, st *layerState) error {
	p, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := path.Dir(p), path.Base(p)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return a.whiteout(dir, base, st)
	}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock:
		a.skipped++
		a.log.Debug("image: skipping device node", "name", hdr.Name, "major", hdr.Devmajor, "minor", hdr.Devminor)
		return nil
	}
	if p == "." {
		if hdr.Typeflag != tar.TypeDir {
			return &refusal{"would replace the root directory"}
		}
		st.dirs[p] = hdr
		return a.lchown(p, hdr)
	}
	var link string
	if hdr.Typeflag == tar.TypeLink {
		if link, err = cleanName(hdr.Linkname); err != nil {
			return &refusal{"hardlink target: " + err.Error()}
		}
		if link == p || link == "." {
			return &refusal{"hardlink to itself or the root"}
		}
	}

	if dir != "." {
		if err := a.root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	st.markSeen(p)
	// Replace whatever is there, unless a directory meets a directory: then the two merge.
	if fi, err := a.root.Lstat(p); err == nil {
		if !fi.IsDir() || hdr.Typeflag != tar.TypeDir {
			if err := a.root.RemoveAll(p); err != nil {
				return err
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := a.root.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		st.dirs[p] = hdr // mode and times once the layer has filled it
		return a.lchown(p, hdr)
	case tar.TypeReg, tar.TypeGNUSparse:
		return a.writeFile(p, hdr, r)
	case tar.TypeSymlink:
		if err := a.root.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
		if err := a.lchown(p, hdr); err != nil {
			return err
		}
		return a.setTimes(p, hdr)
	case tar.TypeLink:
		// Link resolves the target beneath the root and does not follow a final symlink.
		return a.root.Link(link, p)
	case tar.TypeFifo:
		// The host holds no fifos from an image; a sandbox that needs one makes it.
		a.skipped++
		a.log.Debug("image: skipping fifo", "name", hdr.Name)
		return nil
	}
	a.log.Debug("image: skipping tar entry of unknown type", "name", hdr.Name, "type", string(hdr.Typeflag))
	return nil
}

func (st *layerState) markSeen(p string) {
	for ; p != "." && p != "/"; p = path.Dir(p) {
		if st.seen[p] {
			return
		}
		st.seen[p] = true
	}
}

// whiteout applies a .wh.<name> (delete name from lower layers) or .wh..wh..opq (hide all of
// the directory's lower-layer content) entry found in dir.
func (a *applier) whiteout(dir, base string, st *layerState) error {
	if base == opaqueWhiteout {
		d, err := a.root.Open(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return err
		}
		for _, n := range names {
			if p := path.Join(dir, n); !st.seen[p] {
				if err := a.root.RemoveAll(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if strings.HasPrefix(target, whiteoutPrefix) {
		return nil // other AUFS bookkeeping (.wh..wh.plnk, …): nothing to apply
	}
	if target == "" || target == "." || target == ".." {
		return &refusal{"malformed whiteout"}
	}
	p := path.Join(dir, target)
	if st.seen[p] {
		return nil // a whiteout hides lower layers only, never its own layer's entries
	}
	err := a.root.RemoveAll(p)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	return err
}

func (a *applier) writeFile(p string, hdr *tar.Header, r io.Reader) error {
	f, err := a.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := a.copySparse(f, r); err != nil {
		f.Close()
		return err
	}
	if err := a.lchown(p, hdr); err != nil { // before chmod: chown clears set-id bits
		f.Close()
		return err
	}
	if err := f.Chmod(fileMode(hdr)); err != nil {
		f.Close()
		return err
	}
	a.setXattrs(f, hdr)
	if err := f.Close(); err != nil {
		return err
	}
	return a.setTimes(p, hdr)
}

// finishDirs sets the mode and times of the layer's directories, deepest first, now that
// nothing more is written into them.
func (a *applier) finishDirs(st *layerState) error {
	paths := make([]string, 0, len(st.dirs))
	for p := range st.dirs {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	slices.Reverse(paths)
	for _, p := range paths {
		hdr := st.dirs[p]
		if fi, err := a.root.Lstat(p); err != nil || !fi.IsDir() {
			continue // replaced or deleted later in the layer
		}
		if err := a.root.Chmod(p, fileMode(hdr)); err != nil {
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
		if err := a.setTimes(p, hdr); err != nil {
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	return nil
}

// lchown gives p the entry's owner. When the process may not chown (it is not root), ownership
// is dropped with one warning: the tree is then owned by the caller.
func (a *applier) lchown(p string, hdr *tar.Header) error {
	if !a.chown {
		return nil
	}
	err := a.root.Lchown(p, hdr.Uid, hdr.Gid)
	if errors.Is(err, syscall.EPERM) {
		a.chown = false
		a.log.Warn("image: cannot chown (not root?); file ownership from the image is dropped", "err", err)
		return nil
	}
	return err
}

// setTimes sets p's access and modification times without following a final symlink.
func (a *applier) setTimes(p string, hdr *tar.Header) error {
	d, err := a.root.Open(path.Dir(p))
	if err != nil {
		return err
	}
	defer d.Close()
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	ts := []unix.Timespec{timespec(atime), timespec(hdr.ModTime)}
	//confine:host relative to a directory opened through os.Root, final component not followed
	if err := unix.UtimesNanoAt(int(d.Fd()), path.Base(p), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimensat", Path: p, Err: err}
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// setXattrs applies the entry's extended attributes (PAX SCHILY.xattr.*), e.g. file
// capabilities. Failures are logged, not fatal: many filesystems refuse some namespaces.
func (a *applier) setXattrs(f *os.File, hdr *tar.Header) {
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if err := unix.Fsetxattr(int(f.Fd()), attr, []byte(v), 0); err != nil {
			a.log.Debug("image: cannot set xattr", "name", hdr.Name, "xattr", attr, "err", err)
		}
	}
}

// fileMode is the entry's permission bits with sticky. Set-id bits are dropped: the host never
// holds a set-id program an image chose.
func fileMode(hdr *tar.Header) fs.FileMode {
	return hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSticky)
}

// holeBlock is the unit in which runs of zeros become holes.
const holeBlock = 64 << 10

// copySparse copies r to f, leaving blocks of zeros as holes (a sparse or compressed layer
// costs the host only its data), and fails once the image's data passes its limit.
func (a *applier) copySparse(f *os.File, r io.Reader) error {
	limit := a.limit
	if limit <= 0 {
		limit = DefaultMaxBytes
	}
	buf := make([]byte, holeBlock)
	var size int64
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			block := buf[:n]
			if allZero(block) {
				if _, serr := f.Seek(int64(n), io.SeekCurrent); serr != nil {
					return serr
				}
			} else {
				a.written += int64(n)
				if a.written > limit {
					return &refusal{fmt.Sprintf("image unpacks to more than %d bytes", limit)}
				}
				if _, werr := f.Write(block); werr != nil {
					return werr
				}
			}
			size += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return f.Truncate(size) // a file ending in a hole still has its length
		}
		if err != nil {
			return err
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
