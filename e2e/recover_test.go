package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/pkg/client"
)

// TestRecoverFrozen: spaced killed while a sandbox's runtime is frozen (what a crash in the
// middle of a file snapshot, a fork or a full snapshot leaves) finds it paused at restart and
// lets it go on with the same processes instead of tearing it down; scratch that interrupted
// forks and restores left is swept.
func TestRecoverFrozen(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	run(t, c, id, "echo kept > /root/file")
	pid, err := c.ExecBackground(ctx, id, client.ExecRequest{Command: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	runsc := filepath.Join(binDir(t), "runsc")
	root := filepath.Join(d.Opts.Home, "runtime", "gvisor", "runsc")
	state := func() string {
		out, err := exec.Command(runsc, "--root="+root, "state", id).CombinedOutput()
		if err != nil {
			t.Fatalf("runsc state: %v: %s", err, out)
		}
		return string(out)
	}
	d.Kill()
	if out, err := exec.Command(runsc, "--root="+root, "pause", id).CombinedOutput(); err != nil {
		t.Fatalf("runsc pause: %v: %s", err, out)
	}
	if s := state(); !strings.Contains(s, `"paused"`) {
		t.Fatalf("runsc state after pause: %s", s)
	}
	var scratch []string
	for _, p := range []string{"forks/fork_leftover/upper", "work/restore_leftover", "work/ckpt_leftover/upper"} {
		p = filepath.Join(d.Opts.Home, p)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "f"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		scratch = append(scratch, p)
	}
	if err := d.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.State != client.StateRunning {
		t.Fatalf("after restart: %+v %v", sb, err)
	}
	if s := state(); !strings.Contains(s, `"running"`) {
		t.Fatalf("runsc state after restart: %s", s)
	}
	expectKept(t, c, id, "/root/file", "kept\n", pid, "frozen through a crash")
	for _, p := range scratch {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("scratch %s left after restart: %v", p, err)
		}
	}
}
