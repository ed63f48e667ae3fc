package sandbox

import (
	"bufio"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/errdefs"
)

// Capacity is the most this host can give one sandbox.
type Capacity struct {
	VCPUs     int   // CPUs the host has
	MemoryMiB int64 // memory the host has
	DiskMiB   int64 // space free now on the file system that holds sandboxes' writable layers
	Pids      int64 // the kernel's limit on process IDs
}

// HostCapacity reads this host's capacity: its CPUs, its memory (/proc/meminfo MemTotal), the
// free space of the file system holding dir, and /proc/sys/kernel/pid_max.
func HostCapacity(dir string) (Capacity, error) {
	c := Capacity{VCPUs: goruntime.NumCPU()}
	//confine:host the host's /proc
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return c, fmt.Errorf("host memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return c, fmt.Errorf("host memory: %q: %w", v, err)
			}
			c.MemoryMiB = kib >> 10
		}
	}
	if c.MemoryMiB == 0 {
		return c, fmt.Errorf("host memory: no MemTotal in /proc/meminfo")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return c, fmt.Errorf("free disk of %s: %w", dir, err)
	}
	c.DiskMiB = int64(st.Bavail) * st.Bsize >> 20
	//confine:host the host's /proc
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return c, fmt.Errorf("host pid limit: %w", err)
	}
	if c.Pids, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return c, fmt.Errorf("host pid limit: %w", err)
	}
	return c, nil
}

// checkCapacity refuses what the host cannot give: each resource a request names explicitly
// against the host's capacity (defaults are the operator's choice and are not checked).
func (m *Manager) checkCapacity(r Resources) error {
	if m.cfg.Capacity == nil || (r == Resources{}) {
		return nil
	}
	c, err := m.cfg.Capacity()
	if err != nil {
		return fmt.Errorf("host capacity: %w", err)
	}
	switch {
	case r.VCPUs > c.VCPUs:
		return errdefs.InvalidArgument(fmt.Sprintf("resources.vcpus: %d is more than this host's %d CPUs", r.VCPUs, c.VCPUs))
	case r.MemoryMiB > c.MemoryMiB:
		return errdefs.InvalidArgument(fmt.Sprintf("resources.memory_mib: %d is more than this host's %d MiB of memory", r.MemoryMiB, c.MemoryMiB))
	case r.DiskMiB > c.DiskMiB:
		return errdefs.InvalidArgument(fmt.Sprintf("resources.disk_mib: %d is more than the %d MiB of disk this host has free", r.DiskMiB, c.DiskMiB))
	case r.Pids > c.Pids:
		return errdefs.InvalidArgument(fmt.Sprintf("resources.pids: %d is more than this host's limit of %d", r.Pids, c.Pids))
	}
	return nil
}
