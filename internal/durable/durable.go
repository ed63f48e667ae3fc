// Package durable makes files and directories reach the disk: the fsync helpers behind every
// "done only once it is on disk" in SPACE (checkpoints, snapshots, shared layers, templates),
// and WriteFile, the one way a file that must survive (a key, a certificate, metadata) is written.
package durable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/confine"
)

// Sync fsyncs the file or directory at p (a directory: the entries in it). File systems that
// cannot fsync a directory (EINVAL) are not an error.
func Sync(p string) error {
	//confine:host p is a file or directory spaced itself made (trees go through SyncTree and confine)
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}

// SyncTree makes every regular file and directory under dir durable, and dir's entry in its
// parent. It fsyncs file by file rather than the whole file system: syncfs would also wait for
// every other writer (other sandboxes) on the disk. The tree may be one a sandbox wrote, so it
// is walked through confine.
func SyncTree(dir string) error {
	root, err := confine.Open(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.Sync(); err != nil {
		return err
	}
	return Sync(filepath.Dir(dir))
}

// SyncFS flushes the whole file system holding dir (for trees too large to fsync one by one).
func SyncFS(dir string) error {
	//confine:host p is a file or directory spaced itself made (trees go through SyncTree and confine)
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}
