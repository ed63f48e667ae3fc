package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// WritableLayer implements runtime.LayerCapturer: the overlay upper directory of sandbox id.
func (d *Driver) WritableLayer(id string) (string, error) {
	dir := filepath.Join(d.sandboxDir(id), "upper")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("gvisor: sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return dir, nil
}

// Freeze implements runtime.LayerCapturer. It freezes the sandbox's processes (sentry and
// gofer) with the cgroup freezer, which takes well under a millisecond, or with `runsc pause`
// where there is no freezer. File writes of gVisor's root go straight through to the host
// overlay (no --overlay2 memory layer), so the upper directory is complete while frozen.
func (d *Driver) Freeze(ctx context.Context, id string, fn func(dir string) error) (err error) {
	upper := filepath.Join(d.sandboxDir(id), "upper")
	if f, ok := d.freezer(id); ok { // the cgroup exists only while the sandbox does
		if err := f.set(ctx, true); err != nil {
			_ = f.set(context.WithoutCancel(ctx), false)
			return fmt.Errorf("gvisor: freeze %s: %w", id, err)
		}
		defer func() {
			if terr := f.set(context.WithoutCancel(ctx), false); terr != nil {
				err = errors.Join(err, fmt.Errorf("gvisor: thaw %s: %w", id, terr))
			}
		}()
		return fn(upper)
	}
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
	return fn(upper)
}

// freezerFile is a sandbox's cgroup freezer control: v1 freezer.state or v2 cgroup.freeze.
type freezerFile struct {
	path string
	v2   bool
}

func (d *Driver) freezer(id string) (freezerFile, bool) {
	v1 := filepath.Join("/sys/fs/cgroup/freezer", d.cgroupParent(), id, "freezer.state")
	if _, err := os.Stat(v1); err == nil {
		return freezerFile{path: v1}, true
	}
	v2 := filepath.Join("/sys/fs/cgroup", d.cgroupParent(), id, "cgroup.freeze")
	if _, err := os.Stat(v2); err == nil {
		return freezerFile{path: v2, v2: true}, true
	}
	return freezerFile{}, false
}

// set freezes or thaws and waits until the kernel reports it done.
func (f freezerFile) set(ctx context.Context, frozen bool) error {
	val, want := "THAWED", "THAWED"
	if frozen {
		val, want = "FROZEN", "FROZEN"
	}
	if f.v2 {
		val = map[bool]string{true: "1", false: "0"}[frozen]
	}
	if err := os.WriteFile(f.path, []byte(val), 0); err != nil {
		return err
	}
	if f.v2 {
		// cgroup.events says "frozen 1" once every process is stopped.
		events := filepath.Join(filepath.Dir(f.path), "cgroup.events")
		want = "frozen " + val
		f.path = events
	}
	for i := 0; ; i++ {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), want) {
			return nil
		}
		if i > 20000 {
			return fmt.Errorf("cgroup did not become %s", want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Microsecond):
		}
	}
}
