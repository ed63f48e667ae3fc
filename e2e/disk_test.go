package e2e

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/pkg/client"
)

// TestDiskLimit: resources.disk_mib holds. Writes past it fail with ENOSPC inside the sandbox,
// the host's free space drops by no more than the limit, and the sandbox goes on running; a
// pause and resume keep the disk and what is on it.
func TestDiskLimit(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(d.Opts.Home, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	sb := create(t, c, client.CreateSandboxRequest{Template: "minimal", Resources: &client.Resources{DiskMiB: 64}})
	before := free()
	res := run(t, c, sb.ID, "dd if=/dev/urandom of=/root/fill bs=1M count=200 2>&1; echo rc=$?; ls -l /root/fill")
	if !strings.Contains(res.Stdout, "No space left on device") || strings.Contains(res.Stdout, "rc=0") {
		t.Fatalf("writing 200 MiB into a 64 MiB sandbox: %q", res.Stdout)
	}
	used := before - free()
	t.Logf("host free space dropped by %d MiB for a 64 MiB disk", used>>20)
	if used > 80<<20 {
		t.Fatalf("host free space dropped by %d MiB, more than the 64 MiB limit (with room for file system overhead)", used>>20)
	}
	if res := run(t, c, sb.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Fatalf("after the disk filled: %+v", res)
	}
	// Space comes back when the sandbox frees it, and survives a pause.
	run(t, c, sb.ID, "rm /root/fill && echo kept > /root/small")
	if _, err := c.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResumeSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if res := run(t, c, sb.ID, "cat /root/small && dd if=/dev/zero of=/root/again bs=1M count=16 2>/dev/null && echo wrote"); res.Stdout != "kept\nwrote\n" {
		t.Fatalf("after resume: %+v", res)
	}
	if res := run(t, c, sb.ID, "dd if=/dev/urandom of=/root/fill bs=1M count=200 2>&1 | grep -c 'No space'"); strings.TrimSpace(res.Stdout) != "1" {
		t.Fatalf("the limit after resume: %+v", res)
	}
}
