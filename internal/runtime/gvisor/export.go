package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/space-sandbox/space/internal/errdefs"
)

// ExportLayer implements runtime.LayerExporter: it stops the sandbox, unmounts its overlay and
// moves its writable layer (upper/) to dest. The upper directory holds overlayfs whiteouts
// (0/0 character devices) and opaque-directory xattrs, which keep their meaning when dest is
// used as a lower layer. Delete removes the rest afterwards.
func (d *Driver) ExportLayer(ctx context.Context, id, dest string) error {
	sb := d.sandboxDir(id)
	//confine:host the sandbox directory and the destination the caller chose, not paths inside the layer
	if _, err := os.Stat(sb); err != nil {
		return fmt.Errorf("gvisor: sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	//confine:host the sandbox directory and the destination the caller chose, not paths inside the layer
	if _, err := os.Lstat(dest); !errors.Is(err, fs.ErrNotExist) {
		return errdefs.InvalidArgument(fmt.Sprintf("export %s: %s already exists", id, dest))
	}
	// Stop the sandbox so that its writable layer is final: the gofer writes through to the host
	// overlay, and nothing writes once the sandbox is gone.
	if _, err := d.runsc(ctx, id, "kill", id, "KILL"); err != nil {
		d.log.DebugContext(ctx, "kill before export", "id", id, "err", err)
	}
	if err := d.waitStopped(ctx, id); err != nil {
		return fmt.Errorf("gvisor: export %s: %w", id, err)
	}
	if err := killSandboxProcs(ctx, d.runscRoot, id); err != nil {
		return fmt.Errorf("gvisor: export %s: %w", id, err)
	}
	if err := unmountUnder(ctx, filepath.Join(sb, "rootfs")); err != nil {
		return fmt.Errorf("gvisor: export %s: unmount: %w", id, err)
	}
	//confine:host the sandbox directory and the destination the caller chose, not paths inside the layer
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	upper := d.upperDir(id)
	if upper == filepath.Join(sb, "upper") {
		if err := os.Rename(upper, dest); err != nil {
			return fmt.Errorf("gvisor: export %s: %w", id, err)
		}
		return nil
	}
	// A layer on the sandbox's own disk is copied out (through confine) before Delete
	// unmounts that disk.
	if err := os.Mkdir(dest, 0o755); err != nil {
		return fmt.Errorf("gvisor: export %s: %w", id, err)
	}
	if err := copyTree(upper, dest); err != nil {
		os.RemoveAll(dest)
		return fmt.Errorf("gvisor: export %s: %w", id, err)
	}
	return nil
}
