package main

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// mountSpec is one file system the agent mounts if the runtime did not.
type mountSpec struct {
	target, fstype, source string
	flags                  uintptr
	data                   string
	// needed reports whether to mount at all (beyond "not mounted yet").
	needed func() bool
}

func essentialMounts() []mountSpec {
	return []mountSpec{
		{target: "/proc", fstype: "proc", source: "proc", flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{target: "/sys", fstype: "sysfs", source: "sysfs", flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		// A VM kernel without CONFIG_DEVTMPFS_MOUNT leaves /dev empty.
		{target: "/dev", fstype: "devtmpfs", source: "devtmpfs", flags: unix.MS_NOSUID, data: "mode=0755",
			needed: func() bool { _, err := os.Stat("/dev/null"); return err != nil }},
		{target: "/dev/pts", fstype: "devpts", source: "devpts", flags: unix.MS_NOSUID | unix.MS_NOEXEC,
			data: "newinstance,ptmxmode=0666,mode=0620"},
		{target: "/tmp", fstype: "tmpfs", source: "tmpfs", flags: unix.MS_NOSUID | unix.MS_NODEV, data: "mode=1777"},
	}
}

// mountEssentials mounts /proc, /sys, /dev (if empty), /dev/pts and /tmp where nothing is
// mounted yet. gVisor mounts them from the OCI spec; a microVM kernel does not. Failures are
// logged, not fatal: the agent still serves what it can.
func mountEssentials(log *slog.Logger) {
	for _, m := range essentialMounts() {
		if m.needed != nil && !m.needed() {
			continue
		}
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			log.Warn("mkdir mount point", "target", m.target, "err", err)
			continue
		}
		if isMountPoint(m.target) {
			continue
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			log.Warn("mount", "target", m.target, "fstype", m.fstype, "err", err)
			continue
		}
		log.Debug("mounted", "target", m.target, "fstype", m.fstype)
	}
	if _, err := os.Lstat("/dev/ptmx"); errors.Is(err, os.ErrNotExist) {
		_ = os.Symlink("pts/ptmx", "/dev/ptmx")
	}
}

// isMountPoint reports whether dir is the root of a mount: its device differs from its
// parent's, or it is its own parent. It needs no /proc.
func isMountPoint(dir string) bool {
	var st, pst unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &pst) != nil {
		return false
	}
	return st.Dev != pst.Dev || st.Ino == pst.Ino
}
