package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// sandboxProcs returns the PIDs of runsc processes (sandbox, gofer, or a runsc command) for
// container id under runsc root: their command line has --root=<root> and ends with the ID.
func sandboxProcs(root, id string) []int {
	//confine:host the host's /proc
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	rootFlag := []byte("--root=" + root)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		//confine:host the host's /proc
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue // gone, or a zombie
		}
		if isSandboxCmdline(cmdline, rootFlag, id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func isSandboxCmdline(cmdline, rootFlag []byte, id string) bool {
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	return len(args) > 1 && string(args[len(args)-1]) == id &&
		slices.ContainsFunc(args, func(a []byte) bool { return bytes.Equal(a, rootFlag) })
}

// procStart returns the start time of process pid (field 22 of its stat line), which tells a
// process from a later one that reuses its PID.
func procStart(pid int) (string, bool) {
	//confine:host the host's /proc
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(string(stat[i+1:])) // from field 3 (state) on
	if len(f) < 20 {
		return "", false
	}
	return f[19], true
}

// exited reports whether process pid is gone or a zombie.
func exited(pid int) bool {
	//confine:host the host's /proc
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state letter follows "(comm) ", and comm may contain anything but a last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}

// killSandboxProcs SIGKILLs whatever runsc left running for id and waits for it to exit.
// Normally nothing is left after `runsc delete --force`; this makes Delete's promise hold when
// runsc itself failed half way.
func killSandboxProcs(ctx context.Context, root, id string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := sandboxProcs(root, id)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("runsc processes %v for %s do not exit", pids, id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// mountPoints returns the mount points in this mount namespace, in mount order.
func mountPoints() ([]string, error) {
	//confine:host the host's /proc
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 {
			out = append(out, unescapeMount(f[4]))
		}
	}
	return out, nil
}

// unmountUnder unmounts every mount at or below dir, newest first. A busy mount is retried for a
// while, then detached lazily so that the directory can still be removed.
func unmountUnder(ctx context.Context, dir string) error {
	mps, err := mountPoints()
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range slices.Backward(mps) {
		if mp != dir && !strings.HasPrefix(mp, dir+"/") {
			continue
		}
		if err := unmount(ctx, mp); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func unmount(ctx context.Context, mp string) error {
	for range 20 {
		err := unix.Unmount(mp, 0)
		if err == nil || err == unix.EINVAL || err == unix.ENOENT {
			return nil // EINVAL: no longer a mount point
		}
		if err != unix.EBUSY {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
		return fmt.Errorf("lazy unmount %s: %w", mp, err)
	}
	return nil
}

// cgroupMounts returns the mount points of all cgroup (v1) and cgroup2 hierarchies.
func cgroupMounts() ([]string, error) {
	//confine:host the host's /proc
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		_, rest, ok := strings.Cut(line, " - ")
		if !ok || len(f) < 5 {
			continue
		}
		if fstype, _, _ := strings.Cut(rest, " "); fstype == "cgroup" || fstype == "cgroup2" {
			out = append(out, unescapeMount(f[4]))
		}
	}
	return out, nil
}

// removeCgroups removes the cgroup <parent>/<name> in every hierarchy where it exists. runsc
// removes the sandbox's own cgroups on delete; this catches what a failed runsc left, and the
// instance's parent once it is empty. A cgroup whose last process is still exiting is busy for
// a moment, so with retryBusy EBUSY is retried; a parent with children is busy for good.
func removeCgroups(ctx context.Context, parent, name string, retryBusy bool) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		dir := filepath.Join(m, parent, name)
		for try := 0; ; try++ {
			err := unix.Rmdir(dir)
			if err == nil || err == unix.ENOENT {
				break
			}
			if err != unix.EBUSY || !retryBusy || try == 50 {
				errs = append(errs, &fs.PathError{Op: "rmdir", Path: dir, Err: err})
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes the octal escapes (\040 for space etc.) of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
