// Package e2e drives the real spaced binary, with real gVisor sandboxes, through its HTTP API
// (pkg/client) and the space CLI. Every test removes what it made and checks that nothing of its
// instance is left on the host. Needs root, SPACE_PRIVILEGED_TESTS=1 and SPACE_BIN (make test).
package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/internal/testutil"
	"github.com/space-sandbox/space/pkg/client"
)

func binDir(t *testing.T) string {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := os.Getenv("SPACE_BIN")
	if dir == "" {
		t.Skip("SPACE_BIN not set: run through `make test`")
	}
	for _, b := range []string{"spaced", "space", "space-agent", "runsc"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("missing binary: %v", err)
		}
	}
	return dir
}

// startSpaced runs a spaced for the test; at cleanup it deletes any sandbox left, stops spaced
// and fails the test if anything of the instance is left on the host.
func startSpaced(t *testing.T, env ...string) *spacedtest.Daemon {
	t.Helper()
	return startSpacedAt(t, t.TempDir(), env...)
}

// startSpacedAt is startSpaced with SPACE_HOME at home, which the caller made.
func startSpacedAt(t *testing.T, home string, env ...string) *spacedtest.Daemon {
	t.Helper()
	bin := binDir(t)
	// Built-in templates come from a cache shared by every test daemon (base takes minutes to
	// build); each daemon's own built templates stay in its home.
	env = append([]string{"SPACE_TEMPLATES_DIR=" + sharedTemplates()}, env...)
	d, err := spacedtest.Start(context.Background(), spacedtest.Options{Bin: bin, Home: home, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if d.Client != nil {
			if list, err := d.Client.ListSandboxes(ctx, client.ListSandboxesOptions{}); err == nil {
				for _, sb := range list {
					if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
						t.Errorf("cleanup: delete %s: %v", sb.ID, err)
					}
				}
			}
			if list, err := d.Client.ListSnapshots(ctx, ""); err == nil {
				for _, s := range list {
					if err := d.Client.DeleteSnapshot(ctx, s.ID); err != nil {
						t.Errorf("cleanup: delete %s: %v", s.ID, err)
					}
				}
			}
		}
		if err := d.Stop(); err != nil {
			t.Errorf("stop spaced: %v", err)
		}
		if leaks := spacedtest.Leaks(d.Opts.Instance, home); len(leaks) > 0 {
			t.Errorf("instance %s left on the host:\n  %s", d.Opts.Instance, strings.Join(leaks, "\n  "))
		}
		if t.Failed() {
			t.Logf("spaced log:\n%s", tail(d.Log(), 120))
		}
	})
	return d
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T, c *client.Client, req client.CreateSandboxRequest) *client.Sandbox {
	t.Helper()
	sb, err := c.CreateSandbox(ctxT(t), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.State != client.StateRunning {
		t.Fatalf("created sandbox is %s", sb.State)
	}
	return sb
}

func run(t *testing.T, c *client.Client, id, command string) *client.ExecResult {
	t.Helper()
	res, err := c.Exec(ctxT(t), id, client.ExecRequest{Command: command})
	if err != nil {
		t.Fatalf("exec %q: %v", command, err)
	}
	return res
}

// peakRSS returns the peak resident set of pid in KiB and resets the peak first if reset.
func peakRSS(t *testing.T, pid int, reset bool) int {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	if reset {
		if err := os.WriteFile(filepath.Join(dir, "clear_refs"), []byte("5"), 0); err != nil {
			t.Fatalf("reset peak rss: %v", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// expectKept fails t unless file in sandbox id still reads want and process pid still runs.
func expectKept(t *testing.T, c *client.Client, id, file, want string, pid int, when string) {
	t.Helper()
	if res := run(t, c, id, "cat "+file); res.Stdout != want {
		t.Fatalf("%s: %s holds %+v, want %q", when, file, res, want)
	}
	procs, err := c.ListProcesses(ctxT(t), id)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if p := findProc(procs, pid); p == nil || !p.Running {
		t.Fatalf("%s: process %d gone: %+v", when, pid, procs)
	}
}
