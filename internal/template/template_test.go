package template

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/testutil"
)

// hostBusybox returns a private copy of the host's static busybox, so tests may change it.
func hostBusybox(t *testing.T) string {
	t.Helper()
	if err := checkBusybox("/bin/busybox"); err != nil {
		t.Skipf("needs a static /bin/busybox: %v", err)
	}
	p := filepath.Join(t.TempDir(), "busybox")
	if err := copyFile("/bin/busybox", p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// recorder is a slog.Handler that keeps messages, to count builds.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }
func (r *recorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func newStore(t *testing.T, busybox string) (*Store, *recorder) {
	t.Helper()
	rec := &recorder{}
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "templates"), Busybox: busybox, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	return s, rec
}

// versions lists the entries of <Dir>/minimal, including leftovers of interrupted builds.
func versions(t *testing.T, s *Store) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.dir, "minimal"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestEnsureMinimalTree(t *testing.T) {
	bb := hostBusybox(t)
	s, _ := newStore(t, bb)
	before := time.Now()
	tmpl, err := s.Ensure(t.Context(), "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Name != "minimal" || tmpl.Parent != "" || !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(tmpl.Version) {
		t.Errorf("template = %+v", tmpl)
	}
	if want := filepath.Join(s.dir, "minimal", tmpl.Version, "rootfs"); tmpl.RootFS != want {
		t.Errorf("RootFS = %s, want %s", tmpl.RootFS, want)
	}
	if tmpl.CreatedAt.Before(before.Add(-time.Second)) || tmpl.CreatedAt.After(time.Now()) {
		t.Errorf("CreatedAt = %v, not during the test", tmpl.CreatedAt)
	}
	bbInfo, err := os.Stat(bb)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.SizeBytes < bbInfo.Size() || tmpl.SizeBytes > bbInfo.Size()+4096 {
		t.Errorf("SizeBytes = %d, want busybox (%d) plus a few config files", tmpl.SizeBytes, bbInfo.Size())
	}

	root := tmpl.RootFS
	files := map[string]string{
		"etc/passwd":         "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
		"etc/group":          "root:x:0:\nuser:x:1000:\n",
		"etc/hosts":          "127.0.0.1\tlocalhost\n",
		"etc/resolv.conf":    "",
		".space/space-agent": "",
	}
	for p, prefix := range files {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if !strings.HasPrefix(string(b), prefix) || (prefix == "" && len(b) != 0) {
			t.Errorf("%s = %q, want it to start with %q", p, b, prefix)
		}
	}
	dirs := map[string]os.FileMode{
		"tmp":       os.ModeDir | os.ModeSticky | 0o777,
		"var/tmp":   os.ModeDir | os.ModeSticky | 0o777,
		"root":      os.ModeDir | 0o700,
		"home/user": os.ModeDir | 0o755,
		"proc":      os.ModeDir | 0o555,
		"sys":       os.ModeDir | 0o555,
		"dev":       os.ModeDir | 0o755,
		"run":       os.ModeDir | 0o755,
	}
	for p, want := range dirs {
		info, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if info.Mode() != want {
			t.Errorf("%s mode = %v, want %v", p, info.Mode(), want)
		}
	}
	if os.Geteuid() == 0 {
		st, err := os.Stat(filepath.Join(root, "home/user"))
		if err != nil {
			t.Fatal(err)
		}
		if sys := st.Sys().(*syscall.Stat_t); sys.Uid != userUID || sys.Gid != userGID {
			t.Errorf("home/user owned by %d:%d, want 1000:1000", sys.Uid, sys.Gid)
		}
	}

	got, err := os.ReadFile(filepath.Join(root, "bin/busybox"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("bin/busybox differs from the host busybox")
	}
	for _, applet := range []string{"bin/sh", "bin/ls", "bin/sleep", "bin/echo", "bin/cat", "bin/ps"} {
		target, err := os.Readlink(filepath.Join(root, applet))
		if err != nil || target != "/bin/busybox" {
			t.Errorf("%s -> %q (%v), want /bin/busybox", applet, target, err)
		}
	}
	// The applet links work: run the template's shell the way the sandbox will (the absolute
	// link target resolves on the host too, to the same binary).
	out, err := exec.Command(filepath.Join(root, "bin/busybox"), "sh", "-c", "echo hello").Output()
	if err != nil || string(out) != "hello\n" {
		t.Errorf("busybox sh: %q, %v", out, err)
	}
	if st, err := os.Stat(filepath.Join(root, ".space/space-agent")); err != nil || st.Size() != 0 || !st.Mode().IsRegular() {
		t.Errorf("/.space/space-agent must be an empty mount point, not the agent: %v", err)
	}
}

func TestEnsureReusesAndRebuilds(t *testing.T) {
	bb := hostBusybox(t)
	s, rec := newStore(t, bb)
	ctx := t.Context()

	first, err := s.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("second Ensure differs (-first +again):\n%s", diff)
	}
	if n := rec.count("building template"); n != 1 {
		t.Errorf("built %d times for an unchanged busybox, want 1", n)
	}

	// A store opened later on the same directory (spaced restarted) finds the build too.
	s2, err := New(Config{Dir: s.dir, Busybox: bb})
	if err != nil {
		t.Fatal(err)
	}
	reopened, err := s2.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, reopened); diff != "" {
		t.Errorf("reopened store differs:\n%s", diff)
	}

	// Trailing bytes keep busybox a valid static ELF but change its content: a new version.
	f, err := os.OpenFile(bb, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("changed")
	f.Close()
	second, err := s.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if second.Version == first.Version || second.RootFS == first.RootFS {
		t.Fatalf("busybox changed but version stayed %s", second.Version)
	}
	if rec.count("building template") != 2 {
		t.Errorf("builds = %d, want 2", rec.count("building template"))
	}
	if diff := cmp.Diff([]string{second.Version}, versions(t, s)); diff != "" {
		t.Errorf("old version not removed (-want +got):\n%s", diff)
	}
}

func TestEnsureConcurrentBuildsOnce(t *testing.T) {
	s, rec := newStore(t, hostBusybox(t))
	const n = 8
	got := make([]Template, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = s.Ensure(t.Context(), "minimal") })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Ensure %d: %v", i, errs[i])
		}
		if diff := cmp.Diff(got[0], got[i]); diff != "" {
			t.Errorf("Ensure %d differs:\n%s", i, diff)
		}
	}
	if c := rec.count("building template"); c != 1 {
		t.Errorf("%d builds for %d concurrent Ensure calls, want 1", c, n)
	}
	if diff := cmp.Diff([]string{got[0].Version}, versions(t, s)); diff != "" {
		t.Errorf("versions on disk (-want +got):\n%s", diff)
	}
}

func TestEnsureIgnoresAndRemovesInterruptedBuilds(t *testing.T) {
	s, _ := newStore(t, hostBusybox(t))
	version, err := s.version("minimal", s.recipes["minimal"])
	if err != nil {
		t.Fatal(err)
	}
	// A crashed build left a temp dir, and something left an incomplete dir under the final
	// name (no metadata): neither may be taken for a template.
	for _, d := range []string{".tmp-" + version + "-123/rootfs/bin", version + "/rootfs/etc"} {
		if err := os.MkdirAll(filepath.Join(s.dir, "minimal", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := s.List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("List before any complete build = %v, %v; want nothing", list, err)
	}
	tmpl, err := s.Ensure(t.Context(), "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(tmpl.RootFS, "bin/busybox")); err != nil {
		t.Errorf("rebuilt template incomplete: %v", err)
	}
	if diff := cmp.Diff([]string{version}, versions(t, s)); diff != "" {
		t.Errorf("leftovers not removed (-want +got):\n%s", diff)
	}
}

func TestOldVersionKeptWhileMounted(t *testing.T) {
	testutil.RequiresRoot(t)
	bb := hostBusybox(t)
	s, _ := newStore(t, bb)
	old, err := s.Ensure(t.Context(), "minimal")
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox's overlay uses the old version as its lower layer.
	mnt := t.TempDir()
	for _, d := range []string{"upper", "work", "merged"} {
		os.Mkdir(filepath.Join(mnt, d), 0o755)
	}
	opts := "lowerdir=" + old.RootFS + ",upperdir=" + mnt + "/upper,workdir=" + mnt + "/work"
	if err := unix.Mount("overlay", mnt+"/merged", "overlay", 0, opts); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			unix.Unmount(mnt+"/merged", unix.MNT_DETACH)
		}
	})
	os.WriteFile(bb, append(must(os.ReadFile(bb)), "v2"...), 0o755)
	cur, err := s.Ensure(t.Context(), "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{old.Version, cur.Version}, sorted(versions(t, s), old.Version)); diff != "" {
		t.Errorf("while mounted (-want +got):\n%s", diff)
	}
	if err := unix.Unmount(mnt+"/merged", 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if _, err := s.Ensure(t.Context(), "minimal"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{cur.Version}, versions(t, s)); diff != "" {
		t.Errorf("after unmount (-want +got):\n%s", diff)
	}
}

// sorted puts first at the front of a two-element list.
func sorted(v []string, first string) []string {
	if len(v) == 2 && v[1] == first {
		v[0], v[1] = v[1], v[0]
	}
	return v
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestEnsureErrors(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "text")
	os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755)
	dynamic := ""
	for _, p := range []string{"/bin/ls", "/usr/bin/ls", "/bin/bash"} {
		if f, err := os.Open(p); err == nil {
			f.Close()
			if checkBusybox(p) != nil {
				dynamic = p
				break
			}
		}
	}
	tests := []struct {
		name     string
		template string
		busybox  string
		class    error
		contains []string
	}{
		{"unknown template", "ubuntu", "/bin/busybox", errdefs.ErrNotFound, []string{"ubuntu"}},
		{"busybox missing", "minimal", filepath.Join(dir, "nope"), errdefs.ErrFailedPrecondition, []string{"not found", "busybox-static"}},
		{"not an ELF file", "minimal", text, errdefs.ErrFailedPrecondition, []string{"busybox-static"}},
		{"dynamically linked", "minimal", dynamic, errdefs.ErrFailedPrecondition, []string{"dynamically linked", "busybox-static"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.busybox == "" {
				t.Skip("no dynamically linked binary on this host")
			}
			s, rec := newStore(t, tt.busybox)
			_, err := s.Ensure(t.Context(), tt.template)
			if !errors.Is(err, tt.class) {
				t.Fatalf("err = %v, want class %v", err, tt.class)
			}
			for _, c := range tt.contains {
				if !strings.Contains(err.Error(), c) {
					t.Errorf("err %q does not mention %q", err, c)
				}
			}
			if rec.count("building template") != 0 {
				t.Error("started a build")
			}
			if list, _ := s.List(t.Context()); len(list) != 0 {
				t.Errorf("List after failure = %v", list)
			}
		})
	}
}

func TestList(t *testing.T) {
	s, _ := newStore(t, hostBusybox(t))
	list, err := s.List(t.Context())
	if err != nil || len(list) != 0 {
		t.Fatalf("empty store: List = %v, %v", list, err)
	}
	tmpl, err := s.Ensure(t.Context(), "minimal")
	if err != nil {
		t.Fatal(err)
	}
	list, err = s.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Template{tmpl}, list); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
}

func TestEnsureCallerCancelDoesNotAbortSharedBuild(t *testing.T) {
	s, rec := newStore(t, hostBusybox(t))
	// A caller that has given up before calling starts nothing.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Ensure(ctx, "minimal"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Ensure: err = %v, want context.Canceled", err)
	}
	// One of two callers gives up: the build goes on for the other.
	ctx, cancel = context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var cerr error
	wg.Go(func() { _, cerr = s.Ensure(ctx, "minimal") })
	tmpl, err := func() (Template, error) {
		time.AfterFunc(time.Millisecond, cancel)
		return s.Ensure(t.Context(), "minimal")
	}()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if cerr != nil && !errors.Is(cerr, context.Canceled) {
		t.Errorf("cancelled caller: %v", cerr)
	}
	if _, err := os.Stat(filepath.Join(tmpl.RootFS, "bin/busybox")); err != nil {
		t.Error(err)
	}
	if n := rec.count("building template"); n != 1 {
		t.Errorf("builds = %d, want 1 (the cancelled caller's build is shared)", n)
	}
}

func TestUnescapeMount(t *testing.T) {
	tests := map[string]string{
		`/a/b`:          "/a/b",
		`/a\040b`:       "/a b",
		`/a\134b`:       `/a\b`,
		`/a\04`:         `/a\04`,
		`/trailing\`:    `/trailing\`,
		`/x\0401\011y`:  "/x 1\ty",
		`/not\octal9ab`: `/not\octal9ab`,
	}
	for in, want := range tests {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}
