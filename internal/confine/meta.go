package confine

import (
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Info describes a file as lstat does.
type Info struct {
	Mode  uint32 // st_mode: type and permission bits
	UID   int
	GID   int
	Size  int64
	Ino   uint64
	Dev   uint64
	Nlink uint64
	Rdev  uint64
	ATime int64 // nanoseconds since the epoch
	MTime int64
	CTime int64
}

func infoOf(st *unix.Stat_t) Info {
	return Info{
		Mode: st.Mode, UID: int(st.Uid), GID: int(st.Gid), Size: st.Size, Ino: st.Ino, Dev: st.Dev,
		Nlink: uint64(st.Nlink), Rdev: st.Rdev,
		ATime: st.Atim.Nano(), MTime: st.Mtim.Nano(), CTime: st.Ctim.Nano(),
	}
}

// Type is the file type bits (unix.S_IFREG, unix.S_IFDIR, …).
func (i Info) Type() uint32 { return i.Mode & unix.S_IFMT }

// Perm is the permission bits with setuid, setgid and sticky.
func (i Info) Perm() uint32 { return i.Mode & 0o7777 }

// IsDir reports a directory.
func (i Info) IsDir() bool { return i.Type() == unix.S_IFDIR }

// IsRegular reports a regular file.
func (i Info) IsRegular() bool { return i.Type() == unix.S_IFREG }

// IsSymlink reports a symbolic link.
func (i Info) IsSymlink() bool { return i.Type() == unix.S_IFLNK }

// IsWhiteout reports an overlayfs whiteout (a 0:0 character device).
func (i Info) IsWhiteout() bool { return i.Type() == unix.S_IFCHR && i.Rdev == 0 }

// Meta is what SetMeta gives a file.
type Meta struct {
	UID, GID     int
	Mode         uint32 // permission bits; setuid and setgid are always dropped
	ATime, MTime int64  // nanoseconds since the epoch; a zero ATime means MTime
	Xattrs       map[string][]byte
}

// HostSafeMode is mode as the host may hold it: permission bits and sticky, never setuid or
// setgid.
func HostSafeMode(mode uint32) uint32 { return mode & 0o1777 }

// HostSafeXattr reports whether an extended attribute may be set on the host: overlayfs's
// opaque-directory mark (without which a layer means something else) and the user namespace.
// Everything else is dropped: security.capability would grant file capabilities on the host,
// and other trusted.overlay.* attributes steer overlayfs lookups.
func HostSafeXattr(name string) bool {
	return name == "trusted.overlay.opaque" || strings.HasPrefix(name, "user.")
}

// SetMeta gives name m's owner, mode, times and host-safe extended attributes, in an order
// where each step keeps the previous (chown clears set-id bits, writing changes times).
func (d *Dir) SetMeta(name string, m Meta) error {
	fd, info, err := d.openPath("setmeta", name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	link := info.IsSymlink()
	for attr, val := range m.Xattrs {
		if !HostSafeXattr(attr) {
			continue
		}
		if link {
			err = unix.Lsetxattr(procPath(d.fd)+"/"+name, attr, val, 0)
		} else {
			err = unix.Setxattr(procPath(fd), attr, val, 0)
		}
		if err != nil && !unprivileged(err) {
			return d.err("setxattr "+attr, name, err)
		}
	}
	if err := unix.Fchownat(fd, "", m.UID, m.GID, unix.AT_EMPTY_PATH); err != nil && !unprivileged(err) {
		return d.err("chown", name, err)
	}
	ts := times(m)
	if link {
		if err := unix.UtimesNanoAt(d.fd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return d.err("utimes", name, err)
		}
		return nil
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, procPath(fd), HostSafeMode(m.Mode), 0); err != nil {
		return d.err("chmod", name, err)
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(fd), ts, 0); err != nil {
		return d.err("utimes", name, err)
	}
	return nil
}

// setMetaSelf is SetMeta for the directory itself.
func (d *Dir) setMetaSelf(m Meta) error {
	for attr, val := range m.Xattrs {
		if HostSafeXattr(attr) {
			if err := unix.Fsetxattr(d.fd, attr, val, 0); err != nil && !unprivileged(err) {
				return d.err("setxattr "+attr, "", err)
			}
		}
	}
	if err := unix.Fchown(d.fd, m.UID, m.GID); err != nil && !unprivileged(err) {
		return d.err("chown", "", err)
	}
	if err := unix.Fchmod(d.fd, HostSafeMode(m.Mode)); err != nil {
		return d.err("chmod", "", err)
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(d.fd), times(m), 0); err != nil {
		return d.err("utimes", "", err)
	}
	return nil
}

// SetFileMeta is SetMeta for a file this package created and that is still open.
func SetFileMeta(f *os.File, m Meta) error {
	fd := int(f.Fd())
	for attr, val := range m.Xattrs {
		if HostSafeXattr(attr) {
			if err := unix.Fsetxattr(fd, attr, val, 0); err != nil && !unprivileged(err) {
				return pathErr("setxattr "+attr, f.Name(), err)
			}
		}
	}
	if err := unix.Fchown(fd, m.UID, m.GID); err != nil && !unprivileged(err) {
		return pathErr("chown", f.Name(), err)
	}
	if err := unix.Fchmod(fd, HostSafeMode(m.Mode)); err != nil {
		return pathErr("chmod", f.Name(), err)
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(fd), times(m), 0); err != nil {
		return pathErr("utimes", f.Name(), err)
	}
	return nil
}

func times(m Meta) []unix.Timespec {
	at := m.ATime
	if at == 0 {
		at = m.MTime
	}
	return []unix.Timespec{unix.NsecToTimespec(at), unix.NsecToTimespec(m.MTime)}
}

// unprivileged reports an error that only a caller without root gets (tests run unprivileged
// too): ownership and trusted.* attributes are then left as they are.
func unprivileged(err error) bool {
	return os.Geteuid() != 0 && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTSUP))
}
