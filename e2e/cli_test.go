package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// TestCLI drives the real space binary: create, exec (streamed, with the command's exit code),
// cp in and out, ls, info, rm.
func TestCLI(t *testing.T) {
	d := startSpaced(t)
	space := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		return runSpace(t, d, stdin, args...)
	}

	out, errOut, code := space("", "create", "--meta", "who=cli")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sbx_") {
		t.Fatalf("create: %q %q %d", out, errOut, code)
	}
	if out, _, code := space("", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 5"); code != 5 || out != "out\n" {
		t.Fatalf("exec: %q exit %d", out, code)
	}
	if _, errOut, _ := space("", "exec", id, "--", "sh", "-c", "echo err >&2"); errOut != "err\n" {
		t.Fatalf("exec stderr: %q", errOut)
	}
	local := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(local, []byte("from host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := space("", "cp", local, id+":/root/in.txt"); code != 0 {
		t.Fatalf("cp in: %q", errOut)
	}
	if out, _, _ := space("", "exec", id, "--", "cat", "/root/in.txt"); out != "from host\n" {
		t.Fatalf("file inside: %q", out)
	}
	if out, _, code := space("", "cp", id+":/root/in.txt", "-"); code != 0 || out != "from host\n" {
		t.Fatalf("cp out: %q %d", out, code)
	}
	out, _, _ = space("", "ls", "--json")
	var list []client.Sandbox
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].ID != id || list[0].Metadata["who"] != "cli" {
		t.Fatalf("ls --json: %q %v", out, err)
	}
	if out, _, _ := space("", "info", id); !strings.Contains(out, id) || !strings.Contains(out, "running") {
		t.Fatalf("info: %q", out)
	}
	if _, errOut, code := space("", "info", "sbx_aaaaaaaaaaaaaaaaaaaa"); code != 1 || !strings.HasPrefix(errOut, "space: ") {
		t.Fatalf("info of a missing sandbox: %q %d", errOut, code)
	}
	if out, errOut, code := space("", "pause", id); code != 0 || !strings.Contains(out, "paused") {
		t.Fatalf("pause: %q %q", out, errOut)
	}
	if out, _, _ := space("", "exec", id, "--", "cat", "/root/in.txt"); out != "from host\n" { // resumes it
		t.Fatalf("exec on a paused sandbox: %q", out)
	}
	if _, errOut, code := space("", "resume", id); code != 1 || !strings.Contains(errOut, "not paused") {
		t.Fatalf("resume of a running sandbox: %q %d", errOut, code)
	}
	out, errOut, code = space("", "fork", id, "--count", "2")
	forks := strings.Fields(out)
	if code != 0 || len(forks) != 2 {
		t.Fatalf("fork: %q %q", out, errOut)
	}
	if _, errOut, code := space("", append([]string{"rm"}, forks...)...); code != 0 {
		t.Fatalf("rm copies: %q", errOut)
	}
	out, errOut, code = space("", "snapshot", id, "--label", "first")
	snap1 := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(snap1, "snp_") || !strings.Contains(errOut, "newly stored") {
		t.Fatalf("snapshot: %q %q", out, errOut)
	}
	space("", "exec", id, "--", "sh", "-c", "echo changed > /root/in.txt")
	out, _, _ = space("", "snapshot", id, "--full")
	snap2 := strings.TrimSpace(out)
	if out, _, _ := space("", "diff", snap2, snap1); out != "M /root/in.txt (8 bytes)\n" {
		t.Fatalf("diff: %q", out)
	}
	if out, _, _ := space("", "snapshots", id); !strings.Contains(out, snap1) || !strings.Contains(out, "first") || !strings.Contains(out, snap2) || !strings.Contains(out, "full") {
		t.Fatalf("snapshots: %q", out)
	}
	if _, errOut, code := space("", "restore", id, snap1, "/root/in.txt"); code != 0 {
		t.Fatalf("restore: %q", errOut)
	}
	if out, _, _ := space("", "exec", id, "--", "cat", "/root/in.txt"); out != "from host\n" {
		t.Fatalf("after restore: %q", out)
	}
	if out, _, _ := space("", "lineage", id); out != "sandbox "+id+"  (running)\n  snapshot "+snap1+"  (first)\n    snapshot "+snap2+"\n" {
		t.Fatalf("lineage: %q", out)
	}
	if _, errOut, code := space("", "snapshots", "rm", snap1, snap2); code != 0 {
		t.Fatalf("snapshots rm: %q", errOut)
	}
	if _, errOut, code := space("", "rm", id); code != 0 {
		t.Fatalf("rm: %q", errOut)
	}
	if out, _, _ := space("", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls after rm: %q", out)
	}
}

// TestResources: the limits asked for are the limits the sandbox sees.
func TestResources(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	sb := create(t, c, client.CreateSandboxRequest{Resources: &client.Resources{VCPUs: 1, MemoryMiB: 256}})
	res := run(t, c, sb.ID, "free -m | awk '/Mem:/ {print $2}'; nproc")
	lines := strings.Fields(res.Stdout)
	if len(lines) != 2 {
		t.Fatalf("output %q (%s)", res.Stdout, res.Stderr)
	}
	if mem := lines[0]; mem != "256" {
		t.Errorf("memory seen inside: %s MiB, want 256", mem)
	}
	// gVisor shows ceil(quota) CPUs but never fewer than 2 (runsc --cpu-num-from-quota); the
	// quota itself limits CPU time to vcpus.
	if lines[1] != "2" {
		t.Errorf("cpus seen inside: %s, want 2 (gVisor's floor for a 1-CPU quota)", lines[1])
	}
	// The memory limit holds: filling 400 MiB of memory in a 256 MiB sandbox does not succeed.
	// gVisor has no OOM killer of its own, so the host cgroup may end the whole sandbox; then the
	// command fails with "unavailable" and the sandbox is marked crashed, freeing what it held.
	res2, err := c.Exec(ctxT(t), sb.ID, client.ExecRequest{Command: "dd if=/dev/zero of=/dev/shm/fill bs=1M count=400 2>&1; rm -f /dev/shm/fill"})
	var apiErr *client.Error
	switch {
	case err == nil:
		if strings.Contains(res2.Stdout, "400+0 records out") {
			t.Fatalf("wrote 400 MiB to memory in a 256 MiB sandbox: %q", res2.Stdout)
		}
	case errors.As(err, &apiErr) && apiErr.Status == 503:
		got, err := c.GetSandbox(ctxT(t), sb.ID)
		if err != nil || got.State != client.StateError {
			t.Fatalf("after the sandbox died: %+v %v", got, err)
		}
	default:
		t.Fatalf("exec: %v", err)
	}
}

// runSpace runs the real space CLI against d with stdin, returning its stdout, stderr and exit
// code.
func runSpace(t *testing.T, d *spacedtest.Daemon, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir(t), "space"), args...)
	cmd.Env = append(os.Environ(), "SPACE_URL="+d.URL, "SPACE_API_KEY="+d.Opts.Key)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}
