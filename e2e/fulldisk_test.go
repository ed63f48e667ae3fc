package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/pkg/client"
)

// smallHome mounts a filesystem of mib MiB (an ext4 image on a loop device) for SPACE_HOME and
// removes it at cleanup, after spaced has stopped.
func smallHome(t *testing.T, mib int) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"truncate", "-s", fmt.Sprintf("%dM", mib), img},
		{"mkfs.ext4", "-q", "-F", img},
		{"mount", "-o", "loop", img, mnt},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	home := filepath.Join(mnt, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	return home
}

func freeBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// fillTo leaves about keep bytes free on the filesystem of home; the returned function frees
// the space again.
func fillTo(t *testing.T, home string, keep int64) func() {
	t.Helper()
	filler := filepath.Join(filepath.Dir(home), "filler")
	n := freeBytes(t, home) - keep
	if n <= 0 {
		t.Fatalf("only %d bytes free; cannot fill to %d", freeBytes(t, home), keep)
	}
	if out, err := exec.Command("fallocate", "-l", fmt.Sprint(n), filler).CombinedOutput(); err != nil {
		t.Fatalf("fallocate: %v: %s", err, out)
	}
	return func() {
		if err := os.Remove(filler); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Error(err)
		}
	}
}

// TestFullDisk: with SPACE_HOME on a small filesystem that is full, pause, full and file
// snapshots, fork and a template build fail with a clear error (507 insufficient_storage), leave
// the sandbox running as it was and free what they wrote; a sandbox whose on_timeout pause
// cannot be done keeps running and a sandbox.pause_failed event says why. Once space is back,
// everything works and nothing acknowledged was lost.
func TestFullDisk(t *testing.T) {
	home := smallHome(t, 640)
	d := startSpacedAt(t, home, "SPACE_WARM_POOL=0")
	c := d.Client
	ctx := ctxT(t)
	small := &client.Resources{DiskMiB: 128, MemoryMiB: 256}
	sb := create(t, c, client.CreateSandboxRequest{Template: "minimal", Resources: small})
	run(t, c, sb.ID, "head -c 40000000 /dev/urandom > /root/big && echo kept > /root/file")
	pid, err := c.ExecBackground(ctx, sb.ID, client.ExecRequest{Command: "sleep 3600"})
	if err != nil {
		t.Fatal(err)
	}
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	ex := create(t, c, client.CreateSandboxRequest{Template: "minimal", Resources: small, TimeoutSeconds: 20, OnTimeout: "pause"})
	exPID, err := c.ExecBackground(ctx, ex.ID, client.ExecRequest{Command: "sleep 3600"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c, ex.ID, "echo kept > /root/file")

	unfill := fillTo(t, home, 6<<20)
	defer unfill()
	ops := []struct {
		name string
		do   func() error
	}{
		{"pause", func() error { _, err := c.PauseSandbox(ctx, sb.ID); return err }},
		{"full snapshot", func() error { _, err := c.CreateSnapshot(ctx, sb.ID, "full", ""); return err }},
		{"file snapshot", func() error { _, err := c.CreateSnapshot(ctx, sb.ID, "filesystem", ""); return err }},
		{"fork", func() error { _, err := c.ForkSandbox(ctx, sb.ID, 1); return err }},
		{"template build", func() error {
			_, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "fullbuild", From: client.BuildFrom{Template: "minimal"},
				Steps: []client.BuildStep{{Run: "head -c 30000000 /dev/urandom > /big"}}}, nil)
			return err
		}},
	}
	for _, op := range ops {
		before := freeBytes(t, home)
		err := op.do()
		var ce *client.Error
		// A build streams its progress, so its error arrives in the stream with its code.
		if !errors.As(err, &ce) || ce.Code != "insufficient_storage" || (ce.Status != 507 && op.name != "template build") {
			t.Errorf("%s on a full disk: %v; want 507 insufficient_storage", op.name, err)
		} else if !strings.Contains(ce.Message, "space") {
			t.Errorf("%s on a full disk: message %q does not say the disk is full", op.name, ce.Message)
		}
		// What it wrote is freed (a little slack for the database and logs).
		if after := freeBytes(t, home); after < before-(2<<20) {
			t.Errorf("%s on a full disk kept %d bytes", op.name, before-after)
		}
		expectKept(t, c, sb.ID, "/root/file", "kept\n", pid, "after a failed "+op.name)
	}
	if snaps, err := c.ListSnapshots(ctx, sb.ID); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots after failed snapshots: %+v %v", snaps, err)
	}
	if list, err := c.ListSandboxes(ctx, client.ListSandboxesOptions{}); err != nil || len(list) != 2 {
		t.Errorf("sandboxes after a failed fork and build: %+v %v", list, err)
	}
	if tpls, err := c.ListTemplates(ctx); err == nil {
		for _, tp := range tpls {
			if tp.Name == "fullbuild" {
				t.Errorf("a failed build left template %+v", tp)
			}
		}
	}
	for _, sub := range []string{"forks", "work"} {
		if entries, _ := os.ReadDir(filepath.Join(home, sub)); len(entries) > 0 {
			t.Errorf("%s/ holds %d entries after failed operations", sub, len(entries))
		}
	}

	// The sandbox whose on_timeout pause cannot happen keeps running; an event says so.
	deadline := time.After(2 * time.Minute)
	for seen := false; !seen; {
		type evt struct {
			ev  client.Event
			err error
		}
		next := make(chan evt, 1)
		go func() { e, err := events.Next(); next <- evt{e, err} }()
		select {
		case <-deadline:
			t.Fatal("no sandbox.pause_failed event within 2 minutes of the timeout")
		case e := <-next:
			if e.err != nil {
				t.Fatalf("events: %v", e.err)
			}
			var data struct {
				ID     string `json:"sandbox_id"`
				Reason string `json:"reason"`
			}
			_ = json.Unmarshal(e.ev.Data, &data)
			if e.ev.Type == "sandbox.pause_failed" && data.ID == ex.ID {
				seen = true
				if !strings.Contains(data.Reason, "space") {
					t.Errorf("pause_failed reason %q does not say why", data.Reason)
				}
			}
		}
	}
	if got, err := c.GetSandbox(ctx, ex.ID); err != nil || got.State != client.StateRunning {
		t.Fatalf("sandbox whose timed-out pause failed: %+v %v", got, err)
	}
	expectKept(t, c, ex.ID, "/root/file", "kept\n", exPID, "after its on_timeout pause failed")

	// Space back: everything works and nothing was lost.
	unfill()
	if _, err := c.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("pause once space is back: %v", err)
	}
	if _, err := c.ResumeSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	expectKept(t, c, sb.ID, "/root/file", "kept\n", pid, "paused and resumed once space was back")
	snap, err := c.CreateSnapshot(ctx, sb.ID, "filesystem", "")
	if err != nil {
		t.Fatalf("file snapshot once space is back: %v", err)
	}
	if err := c.DeleteSnapshot(context.Background(), snap.ID); err != nil {
		t.Error(err)
	}
}
