package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/space-sandbox/space/internal/agentpb/filesystem"
	"github.com/space-sandbox/space/internal/errdefs"
)

// resolvePath makes p absolute and clean: "~" and "~/x" expand to the user's home, and a
// relative path is taken relative to it.
func resolvePath(u User, p string) (string, error) {
	if p == "" {
		return "", errdefs.InvalidArgument("path is required")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errdefs.InvalidArgument("path contains a NUL byte")
	}
	home := u.Home
	if home == "" {
		home = "/"
	}
	switch {
	case p == "~":
		p = home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(home, p)
	}
	return filepath.Clean(p), nil
}

// fsError classifies an error of the os package, keeping its message.
func fsError(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound(msg)
	case errors.Is(err, fs.ErrExist):
		return errdefs.New(errdefs.ErrAlreadyExists, msg)
	case errors.Is(err, fs.ErrPermission):
		return errdefs.New(errdefs.ErrPermissionDenied, msg)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		return errdefs.InvalidArgument(msg)
	case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EBUSY):
		return errdefs.Conflict(msg)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return errdefs.New(errdefs.ErrResourceExhausted, msg)
	}
	return err
}

// canChown reports whether files must be (and can be) handed to u.
func canChown(u User) bool {
	return os.Geteuid() == 0 && (u.UID != 0 || u.GID != 0)
}

// mkdirAllOwned creates dir and its missing parents (mode 0755), owned by u.
func mkdirAllOwned(dir string, u User) error {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return errdefs.InvalidArgument(fmt.Sprintf("%s is not a directory", p))
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fsError(err)
		}
		missing = append(missing, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fsError(err)
		}
		if canChown(u) {
			if err := os.Lchown(missing[i], int(u.UID), int(u.GID)); err != nil {
				return fsError(err)
			}
		}
	}
	return nil
}

// entryInfo describes the file at path (not following a final symlink) from its lstat info.
func (s *Server) entryInfo(path string, fi fs.FileInfo) *fspb.EntryInfo {
	// Names on disk are bytes; the protocol's strings must be UTF-8 (a message with anything
	// else does not marshal), so invalid sequences are shown as U+FFFD.
	e := &fspb.EntryInfo{
		Name:         validUTF8(filepath.Base(path)),
		Path:         validUTF8(path),
		Size:         fi.Size(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		e.Type = fspb.FileType_FILE_TYPE_FILE
	case m.IsDir():
		e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		e.Type = fspb.FileType_FILE_TYPE_SYMLINK
		if t, err := os.Readlink(path); err == nil {
			t = validUTF8(t)
			e.SymlinkTarget = &t
		}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Mode = st.Mode
		e.Owner, e.Group = s.users.names(st.Uid, st.Gid)
	} else {
		e.Mode = uint32(fi.Mode().Perm())
	}
	e.Owner, e.Group = validUTF8(e.Owner), validUTF8(e.Group)
	e.Permissions = permString(e.Mode)
	return e
}

// validUTF8 is s with each invalid UTF-8 sequence replaced by U+FFFD: what JSON would show.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// statEntry lstat()s path and describes it.
func (s *Server) statEntry(path string) (*fspb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fsError(err)
	}
	return s.entryInfo(path, fi), nil
}

// permString renders a unix st_mode as ls(1) does, e.g. "-rw-r--r--", "drwxrwxrwt".
func permString(mode uint32) string {
	var b [10]byte
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		b[0] = 'd'
	case syscall.S_IFLNK:
		b[0] = 'l'
	case syscall.S_IFIFO:
		b[0] = 'p'
	case syscall.S_IFSOCK:
		b[0] = 's'
	case syscall.S_IFCHR:
		b[0] = 'c'
	case syscall.S_IFBLK:
		b[0] = 'b'
	default:
		b[0] = '-'
	}
	const rwx = "rwxrwxrwx"
	for i := range 9 {
		if mode&(1<<(8-i)) != 0 {
			b[i+1] = rwx[i]
		} else {
			b[i+1] = '-'
		}
	}
	special := func(bit uint32, pos int, set, unsetExec byte) {
		if mode&bit == 0 {
			return
		}
		if b[pos] == 'x' {
			b[pos] = set
		} else {
			b[pos] = unsetExec
		}
	}
	special(syscall.S_ISUID, 3, 's', 'S')
	special(syscall.S_ISGID, 6, 's', 'S')
	special(syscall.S_ISVTX, 9, 't', 'T')
	return string(b[:])
}

// copyTree copies src to dst (files, directories, symlinks), keeping modes, owners and times
// where it can. It is the fallback of Move across file systems.
func copyTree(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(t, dst); err != nil {
			return err
		}
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := copyTree(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
	case fi.Mode().IsRegular():
		if err := copyFile(src, dst, fi.Mode().Perm()); err != nil {
			return err
		}
	default:
		return fmt.Errorf("copy %s: unsupported file type %v", src, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
		_ = os.Lchown(dst, int(st.Uid), int(st.Gid))
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		_ = os.Chmod(dst, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
		_ = os.Chtimes(dst, time.Time{}, fi.ModTime())
	}
	return nil
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
