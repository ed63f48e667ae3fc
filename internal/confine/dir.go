package confine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is an open directory of a Root; its calls take one name in it, never a path.
type Dir struct {
	fd   int
	root *Root
	path string
}

// Close releases the directory.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// Path is the directory's path beneath its root.
func (d *Dir) Path() string { return d.path }

func (d *Dir) err(op, name string, err error) error {
	return d.root.errorf(op, join(d.path, name), err)
}

func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%w: name %q", ErrBadPath, name)
	}
	return nil
}

// Lstat describes name without following it.
func (d *Dir) Lstat(name string) (Info, error) {
	if err := validName(name); err != nil {
		return Info{}, d.err("lstat", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Info{}, d.err("lstat", name, err)
	}
	return infoOf(&st), nil
}

// openPath opens name itself (a symlink is not followed) as an O_PATH descriptor.
func (d *Dir) openPath(op, name string) (int, Info, error) {
	if err := validName(name); err != nil {
		return -1, Info{}, d.err(op, name, err)
	}
	fd, err := openat2(d.fd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveFlags})
	if err != nil {
		return -1, Info{}, d.err(op, name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, Info{}, d.err(op, name, err)
	}
	return fd, infoOf(&st), nil
}

// Open opens the regular file name for reading. It is first opened as a path (which neither
// follows a link nor opens a device), checked, and only then reopened for reading through its
// descriptor, so what is read is the file that was checked.
func (d *Dir) Open(name string) (*os.File, Info, error) {
	pfd, info, err := d.openPath("open", name)
	if err != nil {
		return nil, Info{}, err
	}
	defer unix.Close(pfd)
	if !info.IsRegular() {
		return nil, Info{}, d.err("open", name, ErrNotRegular)
	}
	fd, err := unix.Open(procPath(pfd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, Info{}, d.err("open", name, err)
	}
	return os.NewFile(uintptr(fd), d.root.name+"/"+join(d.path, name)), info, nil
}

// OpenDir opens the directory name (not through a link).
func (d *Dir) OpenDir(name string) (*Dir, error) {
	if err := validName(name); err != nil {
		return nil, d.err("opendir", name, err)
	}
	fd, err := openat2(d.fd, name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags})
	if err != nil {
		return nil, d.err("opendir", name, err)
	}
	return &Dir{fd: fd, root: d.root, path: join(d.path, name)}, nil
}

// DirEntry is one name of a directory and what it is.
type DirEntry struct {
	Name string
	Info Info
}

// Names lists the directory's names, sorted.
func (d *Dir) Names() ([]string, error) {
	fd, err := unix.Dup(d.fd)
	if err != nil {
		return nil, d.err("readdir", "", err)
	}
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		unix.Close(fd)
		return nil, d.err("readdir", "", err)
	}
	f := os.NewFile(uintptr(fd), d.root.name+"/"+d.path)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, d.err("readdir", "", err)
	}
	slices.Sort(names)
	return names, nil
}

// ReadDir lists the directory, sorted, each entry described without following it. Entries
// removed while it reads are left out.
func (d *Dir) ReadDir() ([]DirEntry, error) {
	names, err := d.Names()
	if err != nil {
		return nil, err
	}
	out := make([]DirEntry, 0, len(names))
	for _, n := range names {
		info, err := d.Lstat(n)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, DirEntry{Name: n, Info: info})
	}
	return out, nil
}

// Readlink returns the target of the symbolic link name.
func (d *Dir) Readlink(name string) (string, error) {
	if err := validName(name); err != nil {
		return "", d.err("readlink", name, err)
	}
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(d.fd, name, buf)
		if err != nil {
			return "", d.err("readlink", name, err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// Xattrs returns name's extended attributes, not following it.
func (d *Dir) Xattrs(name string) (map[string][]byte, error) {
	if err := validName(name); err != nil {
		return nil, d.err("listxattr", name, err)
	}
	p := procPath(d.fd) + "/" + name
	return readXattrs(p, unix.Llistxattr, unix.Lgetxattr)
}

func fdXattrs(fd int, name string) (map[string][]byte, error) {
	x, err := readXattrs(procPath(fd), unix.Listxattr, unix.Getxattr)
	if err != nil {
		return nil, pathErr("listxattr", name, err)
	}
	return x, nil
}

func readXattrs(p string, list func(string, []byte) (int, error), get func(string, string, []byte) (int, error)) (map[string][]byte, error) {
	var buf []byte
	for {
		size, err := list(p, nil)
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if size == 0 {
			return nil, nil
		}
		buf = make([]byte, size)
		n, err := list(p, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		buf = buf[:n]
		break
	}
	var out map[string][]byte
	for attr := range strings.SplitSeq(string(buf), "\x00") {
		if attr == "" {
			continue
		}
		val, err := getXattr(p, attr, get)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string][]byte{}
		}
		out[attr] = val
	}
	return out, nil
}

func getXattr(p, attr string, get func(string, string, []byte) (int, error)) ([]byte, error) {
	for {
		size, err := get(p, attr, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size)
		n, err := get(p, attr, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// Mkdir makes the directory name.
func (d *Dir) Mkdir(name string, mode uint32) error {
	if err := validName(name); err != nil {
		return d.err("mkdir", name, err)
	}
	if err := unix.Mkdirat(d.fd, name, mode&0o1777); err != nil {
		return d.err("mkdir", name, err)
	}
	return nil
}

// Create makes the new regular file name and opens it for writing.
func (d *Dir) Create(name string, mode uint32) (*os.File, error) {
	if err := validName(name); err != nil {
		return nil, d.err("create", name, err)
	}
	fd, err := unix.Openat(d.fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode&0o777)
	if err != nil {
		return nil, d.err("create", name, err)
	}
	return os.NewFile(uintptr(fd), d.root.name+"/"+join(d.path, name)), nil
}

// Symlink makes name a symbolic link to target.
func (d *Dir) Symlink(target, name string) error {
	if err := validName(name); err != nil {
		return d.err("symlink", name, err)
	}
	if strings.IndexByte(target, 0) >= 0 || target == "" {
		return d.err("symlink", name, fmt.Errorf("%w: link target %q", ErrBadPath, target))
	}
	if err := unix.Symlinkat(target, d.fd, name); err != nil {
		return d.err("symlink", name, err)
	}
	return nil
}

// Whiteout makes name an overlayfs whiteout, the only device node this package makes.
func (d *Dir) Whiteout(name string) error {
	if err := validName(name); err != nil {
		return d.err("whiteout", name, err)
	}
	if err := unix.Mknodat(d.fd, name, unix.S_IFCHR, 0); err != nil {
		return d.err("whiteout", name, err)
	}
	return nil
}

// Remove removes name (a directory only if empty).
func (d *Dir) Remove(name string) error {
	if err := validName(name); err != nil {
		return d.err("remove", name, err)
	}
	err := unix.Unlinkat(d.fd, name, 0)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Unlinkat(d.fd, name, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return d.err("remove", name, err)
	}
	return nil
}

// RemoveAll removes name and everything beneath it; a missing name is not an error.
func (d *Dir) RemoveAll(name string) error {
	info, err := d.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if info.IsDir() {
		sub, err := d.OpenDir(name)
		if err != nil {
			return err
		}
		names, err := sub.Names()
		if err == nil {
			for _, n := range names {
				if err = sub.RemoveAll(n); err != nil {
					break
				}
			}
		}
		sub.Close()
		if err != nil {
			return err
		}
	}
	if err := d.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
