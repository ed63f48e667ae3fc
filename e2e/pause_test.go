package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/pkg/client"
)

// runtimeProcs counts host processes of a sandbox's runtime (runsc names the sandbox ID).
func runtimeProcs(t *testing.T, id string) int {
	t.Helper()
	n := 0
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), id) {
			n++
		}
	}
	return n
}

// TestPauseResume: pause keeps files and running processes (same PIDs) and holds no runtime;
// using a paused sandbox resumes it; 20 cycles in a row lose nothing.
func TestPauseResume(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	run(t, c, id, "echo kept > /root/file")
	pid, err := c.ExecBackground(ctx, id, client.ExecRequest{Command: "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done"})
	if err != nil {
		t.Fatal(err)
	}
	check := func(round int) {
		t.Helper()
		expectKept(t, c, id, "/root/file", "kept\n", pid, fmt.Sprintf("round %d", round))
	}

	sb, err := c.PauseSandbox(ctx, id)
	if err != nil || sb.State != client.StatePaused {
		t.Fatalf("pause: %+v %v", sb, err)
	}
	if n := runtimeProcs(t, id); n != 0 {
		t.Fatalf("a paused sandbox still has %d runtime processes", n)
	}
	if _, err := c.PauseSandbox(ctx, id); !client.IsConflict(err) {
		t.Fatalf("second pause: %v", err)
	}
	sb, err = c.ResumeSandbox(ctx, id)
	if err != nil || sb.State != client.StateRunning {
		t.Fatalf("resume: %+v %v", sb, err)
	}
	check(0)
	// The counter process went on counting from where it was.
	before := strings.TrimSpace(run(t, c, id, "cat /tmp/counter").Stdout)
	if before == "" || before == "0" {
		t.Fatalf("counter %q", before)
	}

	// exec on a paused sandbox resumes it.
	if _, err := c.PauseSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	check(1)
	if sb, _ := c.GetSandbox(ctx, id); sb.State != client.StateRunning {
		t.Fatalf("after exec on a paused sandbox: %s", sb.State)
	}

	for i := 2; i < 22; i++ {
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			t.Fatalf("round %d: pause: %v", i, err)
		}
		if _, err := c.ResumeSandbox(ctx, id); err != nil {
			t.Fatalf("round %d: resume: %v", i, err)
		}
		check(i)
	}
	// A paused sandbox deletes cleanly (the leak check at cleanup covers its checkpoint).
	if _, err := c.PauseSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.Opts.Home, "checkpoints")); len(entries) != 0 {
		t.Fatalf("checkpoints left: %v", entries)
	}
}

// TestPausedSandboxKeepsItsTemplate: deleting a template does not take the layers from under a
// paused sandbox that was made from it.
func TestPausedSandboxKeepsItsTemplate(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	if _, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "layered", From: client.BuildFrom{Template: "minimal"},
		Steps: []client.BuildStep{{Run: "echo from-layer > /layer.txt"}}}, nil); err != nil {
		t.Fatal(err)
	}
	id := create(t, c, client.CreateSandboxRequest{Template: "layered"}).ID
	if _, err := c.PauseSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, "layered"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResumeSandbox(ctx, id); err != nil {
		t.Fatalf("resume after its template was deleted: %v", err)
	}
	if res := run(t, c, id, "cat /layer.txt"); res.Stdout != "from-layer\n" {
		t.Fatalf("layer gone: %+v", res)
	}
}

// TestTimeoutPauses: with on_timeout "pause" a sandbox whose time is up is paused, not removed;
// it resumes with its files.
func TestTimeoutPauses(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal", TimeoutSeconds: 2, OnTimeout: "pause"}).ID
	run(t, c, id, "echo kept > /root/f")
	for {
		ev, err := events.Next()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(ev.Data), id) && ev.Type == "sandbox.paused" {
			break
		}
		if ev.Type == "sandbox.expired" {
			t.Fatalf("removed instead of paused: %+v", ev)
		}
	}
	if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != client.StatePaused {
		t.Fatalf("after its timeout: %+v %v", sb, err)
	}
	if res := run(t, c, id, "cat /root/f"); res.Stdout != "kept\n" {
		t.Fatalf("after resume: %+v", res)
	}
}

// TestFork: copies of a running sandbox have its files and running processes (same PIDs), are
// independent of it and of each other, answer under their own tokens, and name their parent.
func TestFork(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	parent := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	run(t, c, parent, "echo original > /root/f && head -c 4194304 /dev/urandom > /root/big")
	sum := run(t, c, parent, "md5sum /root/big").Stdout
	pid, err := c.ExecBackground(ctx, parent, client.ExecRequest{Command: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	copies, err := c.ForkSandbox(ctx, parent, 2)
	if err != nil || len(copies) != 2 || copies[0].ID == copies[1].ID || copies[0].ID == parent {
		t.Fatalf("fork: %+v %v", copies, err)
	}
	for i, cp := range copies {
		if cp.Parent == nil || cp.Parent.SandboxID != parent || cp.State != client.StateRunning {
			t.Fatalf("copy %d: %+v", i, cp)
		}
		expectKept(t, c, cp.ID, "/root/f", "original\n", pid, fmt.Sprintf("copy %d", i))
		run(t, c, cp.ID, "echo copy-"+string(rune('a'+i))+" > /root/f")
	}
	if res := run(t, c, parent, "cat /root/f"); res.Stdout != "original\n" {
		t.Fatalf("a copy's write reached the parent: %+v", res)
	}
	if res := run(t, c, copies[1].ID, "cat /root/f"); res.Stdout != "copy-b\n" {
		t.Fatalf("copies are not independent: %+v", res)
	}
	if _, err := c.ForkSandbox(ctx, parent, 0); err == nil {
		t.Fatal("fork of 0 copies accepted")
	}

	// The copies share the parent's files on disk: one shared layer holds the 4 MiB file, and
	// each copy's own writable layer holds only what it wrote.
	home := d.Opts.Home
	if n := treeBytes(t, filepath.Join(home, "layers")); n < 4<<20 || n > 5<<20 {
		t.Fatalf("shared layers hold %d bytes, want one copy of 4 MiB", n)
	}
	for _, cp := range copies {
		if n := treeBytes(t, filepath.Join(home, "runtime", "gvisor", "sandboxes", cp.ID, "upper")); n > 64<<10 {
			t.Fatalf("copy %s has %d bytes of its own", cp.ID, n)
		}
		if got := run(t, c, cp.ID, "md5sum /root/big").Stdout; got != sum {
			t.Fatalf("copy %s: big file %q, want %q", cp.ID, got, sum)
		}
	}

	// A snapshot of a copy carries the shared layer too: with the copies, the parent and the
	// layer gone, a sandbox made from it has every file.
	snap, err := c.CreateSnapshot(ctx, copies[0].ID, client.SnapshotFilesystem, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{parent, copies[0].ID, copies[1].ID} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	layers, _ := filepath.Glob(filepath.Join(home, "layers", "*"))
	for _, l := range layers {
		os.RemoveAll(l)
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{FromSnapshot: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, c, sb.ID, "cat /root/f; md5sum /root/big").Stdout; got != "copy-a\n"+sum {
		t.Fatalf("from a snapshot of a copy whose shared layer was lost: %q", got)
	}
}

// treeBytes sums the sizes of the regular files under dir.
func treeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
