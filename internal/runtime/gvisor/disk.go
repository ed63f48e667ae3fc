package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// A sandbox with Resources.DiskMiB has its writable layer on a file system of its own: a sparse
// ext4 image of that size (disk.img in the sandbox directory) loop-mounted nosuid,nodev at disk/,
// holding upper/ and work/. Writes past the size fail with ENOSPC inside the sandbox, and the
// host's disk gives at most the image's size to it. Without a size the layer is a directory of
// the host's file system (sandboxes made before limits existed, and tests).
const (
	diskImage = "disk.img"
	diskDir   = "disk"
)

// layerDirs returns the overlay upper and work directories of the sandbox directory sb.
func layerDirs(sb string) (upper, work string) {
	//confine:host the sandbox directory's own disk mount point
	if fi, err := os.Lstat(filepath.Join(sb, diskDir)); err == nil && fi.IsDir() {
		return filepath.Join(sb, diskDir, "upper"), filepath.Join(sb, diskDir, "work")
	}
	return filepath.Join(sb, "upper"), filepath.Join(sb, "work")
}

// upperDir is the writable layer of sandbox id.
func (d *Driver) upperDir(id string) string {
	upper, _ := layerDirs(d.sandboxDir(id))
	return upper
}

// makeDisk creates, formats and mounts the sandbox's disk of size MiB under sb. Removing the
// sandbox (unmountUnder, then RemoveAll) undoes it; the loop device goes with the last unmount
// (mount sets it to clear itself).
func makeDisk(ctx context.Context, sb string, mib int64) error {
	img := filepath.Join(sb, diskImage)
	//confine:host a new file of the sandbox directory
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(mib << 20) // sparse: the host pays only for what the sandbox writes
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	// No reserved blocks (the sandbox gets all of its size); lazy initialisation keeps this at
	// a few milliseconds; nodiscard: the image is new and sparse.
	if err := command(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", img); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	mnt := filepath.Join(sb, diskDir)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	if err := command(ctx, "mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", img, mnt); err != nil {
		os.Remove(mnt)
		return fmt.Errorf("disk: %w", err)
	}
	// The file system's own root: lost+found stays beside the layer, not in it.
	for _, sub := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(mnt, sub), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// command runs a host tool and returns its output in the error.
func command(ctx context.Context, name string, args ...string) error {
	path, err := exec.LookPath(name)
	if errors.Is(err, exec.ErrNotFound) {
		return fmt.Errorf("%s not found: resources.disk_mib needs e2fsprogs and util-linux on the host", name)
	}
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(out))
	}
	return nil
}
