package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/space-sandbox/space/internal/confine"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// Usage implements runtime.UsageReporter from the sandbox's cgroup (v1 or v2) and the size of
// its writable layer.
func (d *Driver) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	var u runtime.Usage
	cg := d.cgroupParent() + "/" + id
	read := func(path string) (int64, bool) {
		//confine:host the host's cgroup file system
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil
	}
	if n, ok := read(filepath.Join("/sys/fs/cgroup/cpuacct", cg, "cpuacct.usage")); ok { // v1, ns
		u.CPUSeconds = float64(n) / 1e9
		u.MemoryBytes, _ = read(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.usage_in_bytes"))
		u.MemoryLimit, _ = read(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes"))
	} else if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cg, "cpu.stat")); err == nil { //confine:host the host's cgroup file system; v2
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "usage_usec "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				u.CPUSeconds = float64(n) / 1e6
			}
		}
		u.MemoryBytes, _ = read(filepath.Join("/sys/fs/cgroup", cg, "memory.current"))
		u.MemoryLimit, _ = read(filepath.Join("/sys/fs/cgroup", cg, "memory.max"))
	} else {
		return u, fmt.Errorf("gvisor: usage of %s: no cgroup: %w", id, errdefs.ErrNotFound)
	}
	// The writable layer is the sandbox's: walked through confine, never through its links.
	if root, err := confine.Open(d.upperDir(id)); err == nil {
		u.DiskBytes, _ = root.Size("")
		root.Close()
	}
	return u, nil
}
