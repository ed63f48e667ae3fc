package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// runsc-sandbox's PID for sandbox id: the process holding the sandbox's kernel. Killing it is
// what a crashed runtime looks like.
func sandboxKernelPID(t *testing.T, id string) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if args[0] == "runsc-sandbox" && strings.Contains(string(b), "/sandboxes/"+id) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	t.Fatalf("no runsc-sandbox process for %s", id)
	return 0
}

func snapshot(t *testing.T, c *client.Client, id, kind, label string) *client.Snapshot {
	t.Helper()
	s, err := c.CreateSnapshot(ctxT(t), id, kind, label)
	if err != nil {
		t.Fatalf("snapshot %s of %s: %v", kind, id, err)
	}
	if s.Kind != kind || s.Label != label || s.SandboxID != id || !strings.HasPrefix(s.ID, "snp_") {
		t.Fatalf("snapshot: %+v", s)
	}
	return s
}

func wantStatus(t *testing.T, err error, status int, what string) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != status {
		t.Fatalf("%s: %v, want status %d", what, err, status)
	}
}

// TestSnapshots: file and full snapshots store only what changed, diff and lineage describe
// them, restores bring back paths (processes keep running) or the whole sandbox (a full one
// with its processes), sandboxes can be made from either kind, and deleting a snapshot keeps
// what later ones need.
func TestSnapshots(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	run(t, c, id, "head -c 1048576 /dev/urandom > /root/data && echo v1 > /root/keep && echo x > /etc/added")
	pid, err := c.ExecBackground(ctx, id, client.ExecRequest{Command: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	sum := run(t, c, id, "md5sum /root/data").Stdout

	s1 := snapshot(t, c, id, client.SnapshotFilesystem, "one")
	if s1.SizeBytes < 1<<20 || s1.StoredBytes < 1<<20 || s1.ParentID != "" {
		t.Fatalf("first snapshot: %+v", s1)
	}
	run(t, c, id, "echo v2 > /root/keep && rm /etc/added && echo new > /root/new")
	s2 := snapshot(t, c, id, client.SnapshotFilesystem, "two")
	if s2.ParentID != s1.ID || s2.StoredBytes > 64<<10 {
		t.Fatalf("second snapshot (three small files changed) stored %d bytes: %+v", s2.StoredBytes, s2)
	}
	changes, err := c.Diff(ctx, s2.ID, s1.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []client.Change{
		{Path: "/etc/added", Op: "deleted", Size: 2},
		{Path: "/root/keep", Op: "modified", Size: 3},
		{Path: "/root/new", Op: "added", Size: 4},
	}
	if !reflect.DeepEqual(changes, want) {
		t.Fatalf("diff:\n got %+v\nwant %+v", changes, want)
	}

	// Paths back to the first snapshot while the processes run on.
	if _, err := c.Restore(ctx, id, s1.ID, "/root/keep", "/root/new"); err != nil {
		t.Fatal(err)
	}
	expectKept(t, c, id, "/root/keep", "v1\n", pid, "after restoring paths")
	if res := run(t, c, id, "ls /root/new /etc/added 2>&1; true"); !strings.Contains(res.Stdout, "/root/new: No such file") || !strings.Contains(res.Stdout, "/etc/added: No such file") {
		t.Fatalf("restore of paths: /root/new should be gone and /etc/added (not named) still gone: %q", res.Stdout)
	}

	// A full snapshot, then changes, then the whole sandbox back: processes too.
	f1 := snapshot(t, c, id, client.SnapshotFull, "full")
	if f1.ParentID != s2.ID {
		t.Fatalf("full snapshot's parent %q, want %q", f1.ParentID, s2.ID)
	}
	run(t, c, id, "echo v3 > /root/keep && kill "+strconv.Itoa(pid))
	if _, err := c.Restore(ctx, id, f1.ID); err != nil {
		t.Fatal(err)
	}
	expectKept(t, c, id, "/root/keep", "v1\n", pid, "after a whole restore from a full snapshot")
	if got := run(t, c, id, "md5sum /root/data").Stdout; got != sum {
		t.Fatalf("data after restore: %q, want %q", got, sum)
	}

	// New sandboxes from either kind.
	fromFull, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{FromSnapshot: f1.ID})
	if err != nil {
		t.Fatal(err)
	}
	if fromFull.Parent == nil || fromFull.Parent.SnapshotID != f1.ID || fromFull.Parent.SandboxID != id || fromFull.Template != "minimal" {
		t.Fatalf("sandbox from a full snapshot: %+v", fromFull)
	}
	expectKept(t, c, fromFull.ID, "/root/keep", "v1\n", pid, "sandbox from a full snapshot")
	run(t, c, fromFull.ID, "echo branch > /root/keep")
	if got := run(t, c, id, "cat /root/keep").Stdout; got != "v1\n" {
		t.Fatalf("a branch's write reached its origin: %q", got)
	}
	fromFiles, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{FromSnapshot: s2.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, c, fromFiles.ID, "cat /root/keep /root/new; md5sum /root/data").Stdout; got != "v2\nnew\n"+sum {
		t.Fatalf("sandbox from a file snapshot: %q", got)
	}

	nodes, err := c.Lineage(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	parents := map[string]string{}
	for _, n := range nodes {
		parents[n.ID] = n.ParentID
	}
	wantParents := map[string]string{id: "", s1.ID: id, s2.ID: s1.ID, f1.ID: s2.ID, fromFull.ID: f1.ID, fromFiles.ID: s2.ID}
	if !reflect.DeepEqual(parents, wantParents) {
		t.Fatalf("lineage: %+v\nwant parents %v", nodes, wantParents)
	}

	// Deleting the first snapshot keeps everything the second needs.
	if err := c.DeleteSnapshot(ctx, s1.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSnapshot(ctx, s1.ID); err == nil {
		t.Fatal("deleted snapshot still there")
	}
	if _, err := c.Restore(ctx, fromFull.ID, s2.ID, "/root"); err != nil {
		t.Fatal(err)
	}
	if got := run(t, c, fromFull.ID, "cat /root/keep; md5sum /root/data").Stdout; got != "v2\n"+sum {
		t.Fatalf("restore from the second snapshot after deleting the first: %q", got)
	}
	if list, err := c.ListSnapshots(ctx, id); err != nil || len(list) != 2 {
		t.Fatalf("snapshots of %s: %+v %v", id, list, err)
	}

	// Bad input changes nothing; another tenant sees nothing.
	_, err = c.CreateSnapshot(ctx, id, "bogus", "")
	wantStatus(t, err, http.StatusBadRequest, "kind bogus")
	_, err = c.Restore(ctx, id, s2.ID, "relative/path")
	wantStatus(t, err, http.StatusBadRequest, "relative restore path")
	_, err = c.Restore(ctx, id, "snp_00000000000000000000")
	wantStatus(t, err, http.StatusNotFound, "unknown snapshot")
	_, err = c.Diff(ctx, s2.ID, "")
	wantStatus(t, err, http.StatusBadRequest, "diff without against")
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{FromSnapshot: s2.ID, Template: "base"})
	wantStatus(t, err, http.StatusBadRequest, "from_snapshot with another template")
	key, err := c.CreateKey(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	other, err := client.New(d.URL, key.Key)
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.GetSnapshot(ctx, s2.ID)
	wantStatus(t, err, http.StatusNotFound, "another tenant's snapshot")
	_, err = other.CreateSandbox(ctx, client.CreateSandboxRequest{FromSnapshot: f1.ID})
	wantStatus(t, err, http.StatusNotFound, "sandbox from another tenant's snapshot")
	if list, _ := other.ListSnapshots(ctx, ""); len(list) != 0 {
		t.Fatalf("another tenant lists %d snapshots", len(list))
	}
	if list, _ := c.ListSnapshots(ctx, ""); len(list) != 2 {
		t.Fatalf("after bad input: %d snapshots, want 2", len(list))
	}
}

// TestRecoverFromSnapshot: a sandbox whose runtime dies comes back from its latest full
// snapshot, both while spaced runs (event sandbox.recovered) and when spaced was killed too.
func TestRecoverFromSnapshot(t *testing.T) {
	d := startSpaced(t, "SPACE_WARM_POOL=0")
	c := d.Client
	ctx := ctxT(t)
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	run(t, c, id, "echo acknowledged > /root/f")
	pid, err := c.ExecBackground(ctx, id, client.ExecRequest{Command: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	snapshot(t, c, id, client.SnapshotFull, "")

	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	if err := syscall.Kill(sandboxKernelPID(t, id), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(40 * time.Second)
	for {
		ev, err := events.Next()
		if err != nil {
			t.Fatalf("waiting for sandbox.recovered: %v", err)
		}
		mine := strings.Contains(string(ev.Data), `"sandbox_id":"`+id+`"`)
		if ev.Type == "sandbox.recovered" && mine {
			break
		}
		if ev.Type == "sandbox.crashed" && mine {
			t.Fatalf("sandbox crashed instead of recovering: %+v", ev)
		}
		if time.Now().After(deadline) {
			t.Fatal("no sandbox.recovered event")
		}
	}
	expectKept(t, c, id, "/root/f", "acknowledged\n", pid, "recovered while spaced ran")

	// Both spaced and the runtime die; the restart brings the sandbox back.
	d.Kill()
	if err := syscall.Kill(sandboxKernelPID(t, id), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := d.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.State != client.StateRunning {
		t.Fatalf("after restart: %+v %v", sb, err)
	}
	expectKept(t, c, id, "/root/f", "acknowledged\n", pid, "recovered at restart")
}

// TestAutoSnapshots: a sandbox with auto_snapshot takes a snapshot per interval only when its
// files changed, and keeps the newest few.
func TestAutoSnapshots(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	sb := create(t, c, client.CreateSandboxRequest{Template: "minimal", AutoSnapshot: &client.AutoSnapshot{IntervalSeconds: 2, Keep: 2}})
	if sb.AutoSnapshot == nil || sb.AutoSnapshot.IntervalSeconds != 2 || sb.AutoSnapshot.Keep != 2 {
		t.Fatalf("sandbox: %+v", sb)
	}
	autos := func() []client.Snapshot {
		list, err := c.ListSnapshots(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		return list
	}
	waitFor := func(what string, ok func([]client.Snapshot) bool) []client.Snapshot {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			list := autos()
			if ok(list) {
				return list
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: snapshots %+v", what, list)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	run(t, c, sb.ID, "echo 1 > /root/n")
	first := waitFor("first automatic snapshot", func(l []client.Snapshot) bool { return len(l) == 1 })
	if first[0].Label != "auto" || first[0].Kind != client.SnapshotFilesystem {
		t.Fatalf("automatic snapshot: %+v", first[0])
	}
	time.Sleep(5 * time.Second) // two more intervals with nothing changed
	if n := len(autos()); n != 1 {
		t.Fatalf("%d snapshots after intervals without changes, want 1", n)
	}
	for i := 2; i <= 4; i++ {
		run(t, c, sb.ID, fmt.Sprintf("echo %d > /root/n", i))
		want := fmt.Sprintf("/root/n holds %d", i)
		list := waitFor(want, func(l []client.Snapshot) bool {
			if len(l) == 0 || l[len(l)-1].ID == first[0].ID {
				return false
			}
			ch, err := c.Diff(ctx, l[len(l)-1].ID, first[0].ID)
			return err == nil && len(ch) == 1 && ch[0].Size == 2 && len(l) <= 2 && latestHas(t, c, sb.ID, l[len(l)-1].ID, strconv.Itoa(i))
		})
		first = list[len(list)-1:]
	}
	if n := len(autos()); n != 2 {
		t.Fatalf("%d automatic snapshots kept, want 2", n)
	}
	_, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "minimal", AutoSnapshot: &client.AutoSnapshot{IntervalSeconds: 1}})
	wantStatus(t, err, http.StatusBadRequest, "interval below the minimum")
}

// latestHas reports whether /root/n in snapshot sid reads want (checked by a sandbox made from it).
func latestHas(t *testing.T, c *client.Client, id, sid, want string) bool {
	t.Helper()
	sb, err := c.CreateSandbox(ctxT(t), client.CreateSandboxRequest{FromSnapshot: sid})
	if err != nil {
		return false
	}
	defer c.DeleteSandbox(ctxT(t), sb.ID)
	return run(t, c, sb.ID, "cat /root/n").Stdout == want+"\n"
}
