package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// WritableLayer implements runtime.LayerCapturer: the overlay upper directory of sandbox id.
func (d *Driver) WritableLayer(id string) (string, error) {
	dir := d.upperDir(id)
	//confine:host the writable layer directory itself, by the driver's own path
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("gvisor: sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return dir, nil
}

// Freeze implements runtime.LayerCapturer with `runsc pause` and `runsc resume`: the sentry
// stops every task of the sandbox while fn runs. File writes of gVisor's root go straight
// through to the host overlay (no --overlay2 memory layer), so the upper directory is complete
// while paused. (The cgroup freezer would be faster, but freezing systrap's stub threads from
// outside corrupts them: processes in the sandbox then die with SIGSEGV.)
func (d *Driver) Freeze(ctx context.Context, id string, fn func(dir string) error) (err error) {
	st, err := d.State(ctx, id)
	if err != nil {
		return err
	}
	if st != runtime.StateRunning {
		return fmt.Errorf("gvisor: freeze %s: sandbox is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	if _, err := d.runsc(ctx, id, "pause", id); err != nil {
		return fmt.Errorf("gvisor: freeze %s: %w", id, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, rerr := d.runsc(rctx, id, "resume", id); rerr != nil {
			err = errors.Join(err, fmt.Errorf("gvisor: resume %s after freeze: %w", id, rerr))
		}
	}()
	return fn(d.upperDir(id))
}

// Thaw implements runtime.Thawer with `runsc resume` for a sandbox runsc reports paused.
func (d *Driver) Thaw(ctx context.Context, id string) error {
	st, err := d.State(ctx, id)
	if err != nil {
		return err
	}
	if st != runtime.StatePaused {
		return fmt.Errorf("gvisor: thaw %s: sandbox is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	if _, err := d.runsc(ctx, id, "resume", id); err != nil {
		return fmt.Errorf("gvisor: thaw %s: %w", id, err)
	}
	return nil
}
