package testutil

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup reads one cgroup's files on whichever hierarchy the host has: cgroup v2 (unified,
// mounted at /sys/fs/cgroup, Debian's default) or v1 (one hierarchy per controller under
// /sys/fs/cgroup/<controller>). Path is the cgroup's path below the hierarchy root, e.g.
// "space-ab12/sbx_…". A read of a cgroup that is gone fails the test only where said.
type Cgroup struct {
	V2   bool
	Path string
}

// CgroupOf returns the cgroup at path. It fails t if the host has neither a cgroup v2 root
// nor the v1 memory, cpu, cpuacct and pids hierarchies: limits cannot be checked there, and
// a test that skipped would prove nothing.
func CgroupOf(t testing.TB, path string) Cgroup {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return Cgroup{V2: true, Path: path}
	}
	for _, ctrl := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl, "cgroup.procs")); err != nil {
			t.Fatalf("no cgroup v2 at /sys/fs/cgroup and no v1 %s hierarchy: %v", ctrl, err)
		}
	}
	return Cgroup{Path: path}
}

// File is the host path of a cgroup file: v1Ctrl names the v1 hierarchy it lives in.
func (c Cgroup) File(v1Ctrl, name string) string {
	if c.V2 {
		return filepath.Join("/sys/fs/cgroup", c.Path, name)
	}
	return filepath.Join("/sys/fs/cgroup", v1Ctrl, c.Path, name)
}

// Read returns a cgroup file's content without surrounding space, or "" and the error.
func (c Cgroup) Read(v1Ctrl, name string) (string, error) {
	b, err := os.ReadFile(c.File(v1Ctrl, name))
	return strings.TrimSpace(string(b)), err
}

// Exists reports whether the cgroup is there (its memory controller's directory).
func (c Cgroup) Exists() bool {
	_, err := os.Stat(c.File("memory", ""))
	return err == nil
}

// Value reads a number from a cgroup file: the whole file, or the value of key in a
// flat-keyed file ("key value" lines, as cpu.stat and memory.events) if key is not empty.
// "max" reads as -1. It reports false if the file, or the key in it, cannot be read: a cgroup
// that is gone reads false, so samplers may call it while a sandbox dies.
func (c Cgroup) Value(v1Ctrl, name, key string) (int64, bool) {
	s, err := c.Read(v1Ctrl, name)
	if err != nil {
		return 0, false
	}
	if key != "" {
		found := false
		for line := range strings.Lines(s) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+" "); ok {
				s, found = strings.TrimSpace(v), true
				break
			}
		}
		if !found {
			return 0, false
		}
	}
	if s == "max" {
		return -1, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

func (c Cgroup) number(t testing.TB, v1Ctrl, name string) int64 {
	t.Helper()
	n, ok := c.Value(v1Ctrl, name, "")
	if !ok {
		s, err := c.Read(v1Ctrl, name)
		t.Fatalf("cgroup %s = %q, %v", c.File(v1Ctrl, name), s, err)
	}
	return n
}

// keyed is Value of key, -1 if the file has no such key.
func (c Cgroup) keyed(t testing.TB, v1Ctrl, name, key string) int64 {
	t.Helper()
	if _, err := c.Read(v1Ctrl, name); err != nil {
		t.Fatalf("cgroup %s: %v", c.File(v1Ctrl, name), err)
	}
	n, ok := c.Value(v1Ctrl, name, key)
	if !ok {
		return -1
	}
	return n
}

// MemoryLimit is the memory limit in bytes (-1 for none).
func (c Cgroup) MemoryLimit(t testing.TB) int64 {
	t.Helper()
	if c.V2 {
		return c.number(t, "", "memory.max")
	}
	return c.number(t, "memory", "memory.limit_in_bytes")
}

// MemoryPeak is the highest memory use recorded (v2 memory.peak needs Linux 5.19; -1 if the
// kernel lacks it).
func (c Cgroup) MemoryPeak(t testing.TB) int64 {
	t.Helper()
	if c.V2 {
		if _, err := os.Stat(c.File("", "memory.peak")); err != nil {
			return -1
		}
		return c.number(t, "", "memory.peak")
	}
	return c.number(t, "memory", "memory.max_usage_in_bytes")
}

// OOMKills is how many processes the kernel killed for the memory limit (-1 if the kernel
// does not count them).
func (c Cgroup) OOMKills(t testing.TB) int64 {
	t.Helper()
	if c.V2 {
		return c.keyed(t, "", "memory.events", "oom_kill")
	}
	return c.keyed(t, "memory", "memory.oom_control", "oom_kill")
}

// CPUQuota returns the CPU bandwidth limit: quota and period in microseconds (quota -1 for
// none).
func (c Cgroup) CPUQuota(t testing.TB) (quota, period int64) {
	t.Helper()
	if !c.V2 {
		return c.number(t, "cpu", "cpu.cfs_quota_us"), c.number(t, "cpu", "cpu.cfs_period_us")
	}
	s, err := c.Read("", "cpu.max")
	f := strings.Fields(s)
	if err != nil || len(f) != 2 {
		t.Fatalf("cgroup %s = %q, %v", c.File("", "cpu.max"), s, err)
	}
	period, err = strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("cgroup cpu.max = %q", s)
	}
	if f[0] == "max" {
		return -1, period
	}
	if quota, err = strconv.ParseInt(f[0], 10, 64); err != nil {
		t.Fatalf("cgroup cpu.max = %q", s)
	}
	return quota, period
}

// CPUUsage is the CPU time the cgroup's processes have used.
func (c Cgroup) CPUUsage(t testing.TB) time.Duration {
	t.Helper()
	if c.V2 {
		return time.Duration(c.keyed(t, "", "cpu.stat", "usage_usec")) * time.Microsecond
	}
	return time.Duration(c.number(t, "cpuacct", "cpuacct.usage")) // nanoseconds
}

// Pids returns the number of tasks in the cgroup and its limit (-1 for none).
func (c Cgroup) Pids(t testing.TB) (current, limit int64) {
	t.Helper()
	return c.number(t, "pids", "pids.current"), c.number(t, "pids", "pids.max")
}

// PidsRefused is how many forks the pids limit refused (pids.events "max").
func (c Cgroup) PidsRefused(t testing.TB) int64 {
	t.Helper()
	return c.keyed(t, "pids", "pids.events", "max")
}
