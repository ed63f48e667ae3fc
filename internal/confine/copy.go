package confine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"time"

	"golang.org/x/sys/unix"
)

// CopyStats counts what CopyTree left out.
type CopyStats struct {
	Skipped int // devices, fifos and sockets, which the host never holds
}

// CopyTree copies the content of src's root into dst's root (an existing, empty directory),
// keeping what a writable layer needs: directories, regular files (hard links kept as links),
// symbolic links (never followed), overlayfs whiteouts, owners, times and host-safe extended
// attributes. Set-id bits are dropped; devices, fifos and sockets are left out and counted.
func CopyTree(src, dst *Root) (CopyStats, error) {
	var st CopyStats
	links := map[[2]uint64]string{}
	var dirs []struct {
		p string
		m Meta
	}
	err := src.Walk("", func(e Entry) error {
		m := Meta{UID: e.Info.UID, GID: e.Info.GID, Mode: e.Info.Perm(), ATime: e.Info.ATime, MTime: e.Info.MTime}
		if e.Info.IsDir() || e.Info.IsRegular() || e.Info.IsSymlink() {
			x, err := e.Xattrs()
			if err != nil {
				return err
			}
			m.Xattrs = x
		}
		switch {
		case e.Path == "":
			dirs = append(dirs, struct {
				p string
				m Meta
			}{"", m})
			return nil
		case e.Info.IsDir():
			if err := dst.Mkdir(e.Path, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, struct {
				p string
				m Meta
			}{e.Path, m})
			return nil
		case e.Info.IsRegular():
			if e.Info.Nlink > 1 {
				key := [2]uint64{e.Info.Dev, e.Info.Ino}
				if first, ok := links[key]; ok {
					return dst.Link(first, e.Path)
				}
				links[key] = e.Path
			}
			in, _, err := e.Open()
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := dst.Create(e.Path, 0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return fmt.Errorf("copy %s: %w", e.Path, err)
			}
			err = SetFileMeta(out, m)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			return err
		case e.Info.IsSymlink():
			target, err := e.Readlink()
			if err != nil {
				return err
			}
			if err := dst.Symlink(target, e.Path); err != nil {
				return err
			}
		case e.Info.IsWhiteout():
			if err := dst.Whiteout(e.Path); err != nil {
				return err
			}
		default:
			st.Skipped++
			return nil
		}
		return dst.SetMeta(e.Path, m)
	})
	if err != nil {
		return st, err
	}
	// Directories last, deepest first: filling them changed their times.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := dst.SetMeta(dirs[i].p, dirs[i].m); err != nil {
			return st, err
		}
	}
	return st, nil
}

// Size is the total length of the regular files under p (a missing p is 0).
func (r *Root) Size(p string) (int64, error) {
	var n int64
	err := r.Walk(p, func(e Entry) error {
		if e.Info.IsRegular() {
			n += e.Info.Size
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	return n, err
}

// EnsureDir makes sure p is a real directory beneath the root, with every ancestor a real
// directory: an ancestor or p that is anything else (a link planted by the sandbox, a file) is
// removed and replaced by an empty directory with mode. It is for mount points: what is
// mounted there must not land where a link points.
func (r *Root) EnsureDir(p string, mode uint32) error {
	if c, err := Clean(p); err != nil || c == "" {
		return err
	}
	return r.ensure(p, Info.IsDir, func(c string) error {
		if err := r.Mkdir(c, mode); err != nil {
			return err
		}
		return r.SetMeta(c, Meta{Mode: mode, MTime: time.Now().UnixNano()})
	})
}

// EnsureFile makes sure p is a regular file beneath the root, every ancestor a real directory;
// anything else there is replaced by an empty file with mode.
func (r *Root) EnsureFile(p string, mode uint32) error {
	return r.ensure(p, Info.IsRegular, func(c string) error {
		f, err := r.Create(c, mode)
		if err != nil {
			return err
		}
		return f.Close()
	})
}

// ensure leaves p if it is what want accepts, else replaces whatever is there by what create makes.
func (r *Root) ensure(p string, want func(Info) bool, create func(c string) error) error {
	c, err := Clean(p)
	if err != nil {
		return err
	}
	if c == "" {
		return r.errorf("ensure", c, ErrBadPath)
	}
	if err := r.ensureParent(c); err != nil {
		return err
	}
	info, err := r.Lstat(c)
	switch {
	case err == nil && want(info):
		return nil
	case err == nil:
		if err := r.RemoveAll(c); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	return create(c)
}

func (r *Root) ensureParent(c string) error {
	if d := path.Dir(c); d != "." {
		return r.EnsureDir(d, 0o755)
	}
	return nil
}

// WriteFile writes data as the new content of p: a new regular file replaces whatever p was
// (a link is replaced, never followed).
func (r *Root) WriteFile(p string, data []byte, mode uint32) error {
	if err := r.RemoveAll(p); err != nil {
		return err
	}
	f, err := r.Create(p, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Sync makes every regular file and directory of the tree durable (fsync each, by descriptor).
// File systems that cannot fsync a directory (EINVAL) are not an error.
func (r *Root) Sync() error {
	return r.Walk("", func(e Entry) error {
		switch {
		case e.Info.IsRegular():
			f, _, err := e.Open()
			if err != nil {
				return err
			}
			defer f.Close()
			return syncErr(unix.Fsync(int(f.Fd())), f.Name())
		case e.Info.IsDir():
			if e.Path == "" {
				d, err := r.OpenDir("")
				if err != nil {
					return err
				}
				defer d.Close()
				return syncErr(unix.Fsync(d.fd), r.name)
			}
			d, err := e.dir.OpenDir(e.name)
			if err != nil {
				return err
			}
			defer d.Close()
			return syncErr(unix.Fsync(d.fd), r.name+"/"+e.Path)
		}
		return nil
	})
}

func syncErr(err error, name string) error {
	if err == nil || errors.Is(err, unix.EINVAL) {
		return nil
	}
	return pathErr("fsync", name, err)
}
