package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// descendants lists the processes under pid (children, theirs, ...).
func descendants(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		// Each thread has its own children (Go starts processes from any of its threads).
		tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(p), "task", "*", "children"))
		for _, task := range tasks {
			b, err := os.ReadFile(task)
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
					queue = append(queue, c)
				}
			}
		}
	}
	return out
}

// TestShutdownDuringBaseBuild: SIGTERM while the first base build runs (mmdebstrap), a command
// streams and an event stream is open: spaced exits within 2 s, the build's processes and its
// temporary directory are gone, no warm sandbox was started, and the sandbox that was running
// still runs (sandboxes outlive spaced) and is taken over at the next start.
func TestShutdownDuringBaseBuild(t *testing.T) {
	tpls := t.TempDir() // no base built here: spaced begins building it
	d := startSpaced(t, "SPACE_TEMPLATES_DIR="+tpls, "SPACE_WARM_POOL=2")
	c := d.Client
	ctx := ctxT(t)
	// Whatever fails below, spaced runs again at cleanup (before the harness's own) so that the
	// sandbox is deleted and the leak check sees a clean host.
	t.Cleanup(func() {
		if d.Client.Healthz(context.Background()) == nil {
			return
		}
		d.Opts.Env = append(slices.Clip(d.Opts.Env), "SPACE_TEMPLATES_DIR="+sharedTemplates(), "SPACE_WARM_POOL=0")
		if err := d.Restart(context.Background()); err != nil {
			t.Errorf("restart for cleanup: %v", err)
		}
	})
	sb := create(t, c, client.CreateSandboxRequest{Template: "minimal"})
	run(t, c, sb.ID, "echo kept > /root/file")
	pid, err := c.ExecBackground(ctx, sb.ID, client.ExecRequest{Command: "sleep 3600"})
	if err != nil {
		t.Fatal(err)
	}
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	stream, err := c.ExecEvents(ctx, sb.ID, client.ExecRequest{Command: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var build []int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		for _, p := range descendants(d.PID()) {
			if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "cmdline")); err == nil && strings.Contains(string(b), "mmdebstrap") {
				build = append(build, p)
			}
		}
		if len(build) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("base build did not start within a minute:\n%s", tail(d.Log(), 20))
		}
	}
	time.Sleep(2 * time.Second) // well into the build

	t0 := time.Now()
	if err := syscall.Kill(d.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ps, err := d.WaitExit(30 * time.Second)
	took := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("spaced exited %v %s after SIGTERM", ps, took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("spaced took %s to stop on SIGTERM during a base build; want at most 2 s:\n%s", took, tail(d.Log(), 30))
	}
	if !ps.Success() {
		t.Errorf("spaced exited %v on SIGTERM", ps)
	}
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var left []int
		for _, p := range build {
			if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(p))); err == nil && !exited(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("build processes %v still running after spaced stopped", left)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(tpls, "base")); len(entries) > 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the interrupted build left %v in the templates directory", names)
	}
	root := filepath.Join(d.Opts.Home, "runtime", "gvisor", "runsc")
	out, err := exec.Command(filepath.Join(binDir(t), "runsc"), "--root="+root, "list", "-quiet").CombinedOutput()
	if err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, []string{sb.ID}) {
		t.Errorf("runtimes after shutdown: %v, want only the running sandbox %s (no warm sandbox started)", got, sb.ID)
	}

	// The next start (on the shared templates, no warm pool) takes the sandbox over.
	d.Opts.Env = append(slices.Clip(d.Opts.Env), "SPACE_TEMPLATES_DIR="+sharedTemplates(), "SPACE_WARM_POOL=0")
	if err := d.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	expectKept(t, c, sb.ID, "/root/file", "kept\n", pid, "after a shutdown")
}

// exited reports whether process pid is gone or a zombie.
func exited(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}
