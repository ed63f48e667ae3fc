package fake

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// ExportLayer implements runtime.LayerExporter: it stops the sandbox and moves its writable
// layer to dest (which must not exist). Delete removes the rest afterwards.
func (d *Driver) ExportLayer(_ context.Context, id, dest string) error {
	inst, err := d.lookup("export", id)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(dest); !errors.Is(err, fs.ErrNotExist) {
		return errdefs.InvalidArgument(fmt.Sprintf("fake: export %s: %s already exists", id, dest))
	}
	d.stop(inst)
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return fmt.Errorf("fake: export %s: %w", id, err)
	}
	if err := os.Rename(inst.layer(), dest); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("fake: export %s: layer already exported: %w", id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("fake: export %s: %w", id, err)
	}
	return nil
}

// Usage implements runtime.UsageReporter: the layer's size and the spec's memory limit; CPU and
// memory in use are 0 (see the package doc), memory MemoryInUse's answer if set.
func (d *Driver) Usage(_ context.Context, id string) (runtime.Usage, error) {
	inst, err := d.lookup("usage of", id)
	if err != nil {
		return runtime.Usage{}, err
	}
	d.mu.Lock()
	dead := inst.dead
	d.mu.Unlock()
	if dead {
		return runtime.Usage{}, fmt.Errorf("fake: usage of %s: sandbox is stopped: %w", id, errdefs.ErrNotFound)
	}
	limit := inst.spec.Resources.MemoryMiB
	if limit == 0 {
		limit = DefaultMemoryMiB
	}
	u := runtime.Usage{MemoryLimit: limit << 20}
	if d.MemoryInUse != nil {
		u.MemoryBytes = d.MemoryInUse(id)
	}
	if u.DiskBytes, err = layerSize(inst.layer()); err != nil {
		return runtime.Usage{}, fmt.Errorf("fake: usage of %s: %w", id, err)
	}
	return u, nil
}
