package template

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
)

// ExportExt4 writes template name as an ext4 disk image at dest (which must not exist), for
// drivers that boot a root disk (microVMs). The template's layers are flattened through a
// read-only overlay mount, so whiteouts are applied; files keep their modes, owners and
// symlinks. Needs root (mount) and mkfs.ext4 (e2fsprogs) with -d.
func (s *Store) ExportExt4(ctx context.Context, name, dest string) error {
	t, err := s.Ensure(ctx, name)
	if err != nil {
		return err
	}
	//confine:host the export destination and its temporary image file, which the store makes
	if _, err := os.Lstat(dest); !errors.Is(err, fs.ErrNotExist) {
		return errdefs.InvalidArgument(fmt.Sprintf("export: %s already exists", dest))
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("export: mkfs.ext4 not found (install the e2fsprogs package): %w", errdefs.ErrUnavailable)
	}
	src := t.RootFS
	if len(t.Layers) > 0 {
		mnt, err := os.MkdirTemp("", "space-export-")
		if err != nil {
			return err
		}
		defer os.Remove(mnt)
		lowers := make([]string, 0, len(t.Layers)+1)
		for i := len(t.Layers) - 1; i >= 0; i-- {
			lowers = append(lowers, t.Layers[i])
		}
		lowers = append(lowers, t.RootFS)
		// Two or more lower dirs and no upper: a read-only merged view.
		if len(lowers) == 1 {
			lowers = append(lowers, lowers[0])
		}
		if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "lowerdir="+strings.Join(lowers, ":")); err != nil {
			return fmt.Errorf("export: mount layers: %w", err)
		}
		defer unix.Unmount(mnt, unix.MNT_DETACH)
		src = mnt
	}
	size, err := treeSize(src)
	if err != nil {
		return err
	}
	// Room for metadata and some writes: the tree plus a third, at least 64 MiB.
	mib := max(64, size*4/3/(1<<20)+32)
	tmp := dest + ".tmp"
	defer os.Remove(tmp)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4", "-L", "space-"+name, "-d", src, tmp, fmt.Sprintf("%dM", mib))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("export: mkfs.ext4: %v: %s", err, strings.TrimSpace(out.String()))
	}
	//confine:host the export destination and its temporary image file, which the store makes
	f, err := os.Open(tmp)
	if err != nil {
		return err
	}
	serr := f.Sync()
	f.Close()
	if serr != nil {
		return serr
	}
	if err := os.Rename(tmp, dest); err != nil {
		return err
	}
	return durable.Sync(filepath.Dir(dest))
}
