package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// checkpointSlack is what a checkpoint may need beyond the sandbox's memory and files (runsc's
// metadata, the file system's own blocks), and what is left for everything else on the disk.
const checkpointSlack = 64 << 20

// freeSpace is the space free for spaced under its state directory (of the nearest directory
// that exists, should it not be made yet).
func (m *Manager) freeSpace() (int64, error) {
	var st unix.Statfs_t
	for dir := filepath.Clean(m.cfg.StateDir); ; dir = filepath.Dir(dir) {
		err := unix.Statfs(dir, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize), nil
		}
		if !errors.Is(err, unix.ENOENT) || dir == filepath.Dir(dir) {
			return 0, err
		}
	}
}

// roomForCheckpoint refuses, before anything is touched, a checkpoint of b (pause, fork, full
// snapshot) that the disk under the state directory cannot hold: a checkpoint holds the
// sandbox's memory and a copy of its writable layer, and a runtime whose checkpoint runs out of
// space part way may not survive it. Without a usage report it lets the checkpoint try. The
// caller holds b.mu.
func (m *Manager) roomForCheckpoint(ctx context.Context, b *box, what string) error {
	ur, ok := m.cfg.Drivers[b.rec.Runtime].(runtime.UsageReporter)
	if !ok || m.cfg.StateDir == "" {
		return nil
	}
	u, err := ur.Usage(ctx, b.rec.ID)
	if err != nil {
		return nil // the checkpoint itself will tell
	}
	free, err := m.freeSpace()
	if err != nil {
		return nil
	}
	need := u.MemoryBytes + u.DiskBytes + checkpointSlack
	if free < need {
		return errdefs.New(errdefs.ErrInsufficientStorage, fmt.Sprintf(
			"not enough disk space to %s: needs about %d MiB where the server keeps sandbox state, %d MiB free; the sandbox runs on as it was",
			what, need>>20, free>>20))
	}
	return nil
}
