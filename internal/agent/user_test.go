package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/testutil"
)

// Commands and uploads for a non-root user run and land with that user's identity.
func TestRunAsOtherUser(t *testing.T) {
	testutil.RequiresRoot(t)
	a := startAgent(t)
	for _, d := range []string{filepath.Dir(a.home), a.home} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	aliceHome := filepath.Join(a.home, "alice")
	if err := os.Mkdir(aliceHome, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(aliceHome, 12345, 12345); err != nil {
		t.Fatal(err)
	}

	r := run(t, a.c, agent.ExecRequest{Argv: []string{"sh", "-c", "id -u; id -g; id -G; echo $HOME $USER; pwd"}, User: "alice"})
	want := "12345\n12345\n12345 777\n" + aliceHome + " alice\n" + aliceHome + "\n"
	if r.stdout != want {
		t.Fatalf("as alice: %q (stderr %q), want %q", r.stdout, r.stderr, want)
	}

	ctx := testCtx(t)
	e, err := a.c.Upload(ctx, "new/dir/file.txt", 0, "alice", strings.NewReader("mine"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != filepath.Join(aliceHome, "new/dir/file.txt") {
		t.Fatalf("relative upload landed at %s", e.Path)
	}
	for _, p := range []string{e.Path, filepath.Join(aliceHome, "new/dir"), filepath.Join(aliceHome, "new")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 12345 || st.Gid != 12345 {
			t.Errorf("%s owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
	// Relative paths of a download resolve against alice's home too.
	rc, n, err := a.c.Download(ctx, "new/dir/file.txt", "alice")
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if n != 4 {
		t.Fatalf("download size %d", n)
	}
}
