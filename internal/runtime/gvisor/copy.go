package gvisor

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// copyTree copies the contents of directory src into the existing directory dst, keeping
// everything overlayfs and gVisor care about in a writable layer: file types including
// whiteouts (0:0 character devices), ownership, permission bits with setuid and sticky, times,
// extended attributes (trusted.overlay.opaque, security.capability, user.*) and hard links.
// Sockets are skipped. Regular files are copied with copy_file_range where the kernel can.
func copyTree(src, dst string) error {
	c := treeCopier{links: map[[2]uint64]string{}, root: os.Geteuid() == 0}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("copy %s: not a directory", src)
	}
	if err := c.children(src, dst); err != nil {
		return err
	}
	return c.meta(src, dst, &st)
}

type treeCopier struct {
	links map[[2]uint64]string // (dev, ino) of multiply linked files → first copy
	root  bool
}

func (c *treeCopier) children(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := c.entry(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func (c *treeCopier) entry(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		if err := c.children(src, dst); err != nil {
			return err
		}
	case unix.S_IFREG:
		if st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := c.links[key]; ok {
				return os.Link(first, dst)
			}
			c.links[key] = dst
		}
		if err := copyFile(src, dst, 0o600); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return &os.PathError{Op: "mknod", Path: dst, Err: err}
		}
	default: // sockets: meaningless without their listener
		return nil
	}
	return c.meta(src, dst, &st)
}

// meta copies xattrs, owner, mode and times, in an order where each step keeps the previous:
// chown clears setuid bits, and writing anything changes mtime.
func (c *treeCopier) meta(src, dst string, st *unix.Stat_t) error {
	if err := c.xattrs(src, dst); err != nil {
		return err
	}
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil && (c.root || err != unix.EPERM) {
		return &os.PathError{Op: "lchown", Path: dst, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return &os.PathError{Op: "chmod", Path: dst, Err: err}
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return nil
}

func (c *treeCopier) xattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		val, err := getXattr(src, name)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			// Unprivileged copies (tests) cannot set trusted.* attributes.
			if !c.root && (err == unix.EPERM || err == unix.ENOTSUP) {
				continue
			}
			return &os.PathError{Op: "setxattr " + name, Path: dst, Err: err}
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	size, err := unix.Llistxattr(path, nil)
	for {
		if err == unix.ENOTSUP {
			return nil, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "listxattr", Path: path, Err: err}
		}
		if size == 0 {
			return nil, nil
		}
		buf := make([]byte, size)
		n, err2 := unix.Llistxattr(path, buf)
		if err2 == unix.ERANGE { // grew in between
			size, err = unix.Llistxattr(path, nil)
			continue
		}
		if err2 != nil {
			return nil, &os.PathError{Op: "listxattr", Path: path, Err: err2}
		}
		var names []string
		for _, b := range splitNul(buf[:n]) {
			names = append(names, string(b))
		}
		return names, nil
	}
}

func getXattr(path, name string) ([]byte, error) {
	for {
		size, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return nil, &os.PathError{Op: "getxattr " + name, Path: path, Err: err}
		}
		buf := make([]byte, size)
		n, err := unix.Lgetxattr(path, name, buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "getxattr " + name, Path: path, Err: err}
		}
		return buf[:n], nil
	}
}

func splitNul(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != 0 {
			i++
		}
		if i > 0 {
			out = append(out, b[:i])
		}
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	return out
}

// copyFile copies a regular file's content to a new file dst with mode perm.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
