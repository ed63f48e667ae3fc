package confine

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/testutil"
)

const canary = "CANARY-host-secret-bytes"

// hostile makes a tree the way a sandbox would, beside a host file holding the canary.
func hostile(t testing.TB) (root *Root, dir, secret string) {
	t.Helper()
	base := t.TempDir()
	secret = filepath.Join(base, "secret")
	if err := os.WriteFile(secret, []byte(canary), 0o600); err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(base, "tree")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc/ssl/certs"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "etc/ok"), []byte("fine"), 0o644))
	must(os.Symlink(secret, filepath.Join(dir, "etc/ssl/certs/ca-certificates.crt")))
	must(os.Symlink("../../secret", filepath.Join(dir, "rel")))
	must(os.Symlink("/", filepath.Join(dir, "hostroot")))
	must(os.Symlink(filepath.Dir(secret), filepath.Join(dir, "updir")))
	must(os.Symlink("/proc/self/root"+secret, filepath.Join(dir, "magic")))
	must(os.Symlink("etc", filepath.Join(dir, "inner"))) // even a link that stays inside is not followed
	r, err := Open(dir)
	must(err)
	t.Cleanup(func() { r.Close() })
	return r, dir, secret
}

func TestNoPathLeavesTheRoot(t *testing.T) {
	r, _, secret := hostile(t)
	paths := []string{
		"etc/ssl/certs/ca-certificates.crt", "rel", "hostroot" + secret, "hostroot/etc/passwd",
		"updir/secret", "magic", "inner/ok", "../secret", "/etc/passwd", "etc/../../secret",
		"etc/./ok", "", "hostroot", "updir",
	}
	for _, p := range paths {
		if b, err := r.ReadFile(p, 1<<20); err == nil || bytes.Contains(b, []byte(canary)) {
			t.Errorf("ReadFile(%q) = %q, %v; want an error", p, b, err)
		}
		if f, _, err := r.Open(p); err == nil {
			f.Close()
			t.Errorf("Open(%q) succeeded", p)
		}
	}
	// Through links: refused as links, not reported as missing.
	for _, p := range []string{"hostroot/etc/passwd", "updir/secret", "inner/ok"} {
		if _, err := r.Lstat(p); !errors.Is(err, ErrSymlink) {
			t.Errorf("Lstat(%q): %v, want ErrSymlink", p, err)
		}
	}
	for _, p := range []string{"../secret", "/etc/passwd", "etc/../../secret", "etc/./ok", "a\x00b"} {
		if _, err := r.Lstat(p); !errors.Is(err, ErrBadPath) {
			t.Errorf("Lstat(%q): %v, want ErrBadPath", p, err)
		}
	}
	// The links themselves are described, and their targets read, without following.
	info, err := r.Lstat("etc/ssl/certs/ca-certificates.crt")
	if err != nil || !info.IsSymlink() {
		t.Fatalf("Lstat of the planted link: %+v, %v", info, err)
	}
	if target, err := r.Readlink("etc/ssl/certs/ca-certificates.crt"); err != nil || target != secret {
		t.Fatalf("Readlink: %q, %v", target, err)
	}
	if b, err := r.ReadFile("etc/ok", 100); err != nil || string(b) != "fine" {
		t.Fatalf("a regular file: %q, %v", b, err)
	}
	if _, err := r.ReadFile("etc/ok", 2); err == nil {
		t.Fatal("ReadFile past its limit succeeded")
	}
	// Writing through a link is refused too, and the host file is untouched.
	if err := r.WriteFile("updir/secret", []byte("x"), 0o644); err == nil {
		t.Error("WriteFile through a linked directory succeeded")
	}
	if err := r.MkdirAll("hostroot/tmp/planted", 0o755); err == nil {
		t.Error("MkdirAll through a link succeeded")
	}
	if err := r.RemoveAll("updir/secret"); err == nil {
		t.Error("RemoveAll through a link succeeded")
	}
	if b, _ := os.ReadFile(secret); string(b) != canary {
		t.Fatalf("host file changed: %q", b)
	}
	// Replacing a planted link with a file writes in the tree, not at the target.
	if err := r.WriteFile("etc/ssl/certs/ca-certificates.crt", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(secret); string(b) != canary {
		t.Fatalf("host file changed: %q", b)
	}
}

func TestWalkNeverFollows(t *testing.T) {
	r, _, _ := hostile(t)
	var seen []string
	err := r.Walk("", func(e Entry) error {
		seen = append(seen, e.Path)
		if e.Info.IsRegular() {
			f, _, err := e.Open()
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(f)
			f.Close()
			if bytes.Contains(b, []byte(canary)) {
				t.Errorf("walk read the canary through %s", e.Path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "|etc|etc/ok|etc/ssl|etc/ssl/certs|etc/ssl/certs/ca-certificates.crt|hostroot|inner|magic|rel|updir"
	if got := strings.Join(seen, "|"); got != want {
		t.Fatalf("walk:\n got %s\nwant %s", got, want)
	}
}

// TestSwapRace: a file swapped with a link to a host file while it is opened over and over is
// either the file or refused, never the host file.
func TestSwapRace(t *testing.T) {
	r, dir, secret := hostile(t)
	p := filepath.Join(dir, "swap")
	if err := os.WriteFile(p, []byte("plain"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tmpLink, tmpFile := p+".l", p+".f"
		for !stop.Load() {
			os.Remove(tmpLink)
			os.Symlink(secret, tmpLink)
			os.Rename(tmpLink, p)
			os.WriteFile(tmpFile, []byte("plain"), 0o644)
			os.Rename(tmpFile, p)
		}
	}()
	deadline := time.Now().Add(300 * time.Millisecond)
	opened := 0
	for time.Now().Before(deadline) {
		err := r.Walk("", func(e Entry) error {
			if e.Path == "swap" && e.Info.IsRegular() {
				f, _, err := e.Open()
				if err != nil {
					return nil
				}
				b, _ := io.ReadAll(f)
				f.Close()
				opened++
				if string(b) != "plain" {
					t.Errorf("read %q through a swapped entry", b)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if b, err := r.ReadFile("swap", 100); err == nil && string(b) != "plain" {
			t.Fatalf("ReadFile read %q", b)
		}
	}
	stop.Store(true)
	wg.Wait()
	if opened == 0 {
		t.Fatal("the race never opened the file")
	}
}

// TestDeepAndStrangeNames: deeper than PATH_MAX and names that are not UTF-8.
func TestDeepAndStrangeNames(t *testing.T) {
	src, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	name := strings.Repeat("d", 200)
	p := ""
	for range 40 { // 40 × 201 bytes: well past PATH_MAX
		p = join(p, name)
	}
	if err := src.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	odd := join(p, "bad\xff\xfe name\n")
	if err := src.WriteFile(odd, []byte("deep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := src.ReadFile(odd, 10); err != nil || string(b) != "deep" {
		t.Fatalf("deep read: %q, %v", b, err)
	}
	dstDir := t.TempDir()
	dst, err := Open(dstDir)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := CopyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := dst.ReadFile(odd, 10); err != nil || string(b) != "deep" {
		t.Fatalf("deep copy: %q, %v", b, err)
	}
	if n, err := dst.Size(""); err != nil || n != 4 {
		t.Fatalf("size %d, %v", n, err)
	}
	if err := dst.RemoveAll(name); err != nil {
		t.Fatal(err)
	}
	if names, _ := os.ReadDir(dstDir); len(names) != 0 {
		t.Fatalf("left after RemoveAll: %v", names)
	}
}

// TestCopyTreeIsHostSafe: set-id bits, devices, fifos and capabilities do not reach the host;
// whiteouts, hard links, links and ownership do.
func TestCopyTreeIsHostSafe(t *testing.T) {
	testutil.RequiresRoot(t)
	srcDir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(srcDir, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chmod(filepath.Join(srcDir, "suid"), 0o4755|fs.ModeSetgid))
	must(unix.Chmod(filepath.Join(srcDir, "suid"), 0o6755))
	must(os.Mkdir(filepath.Join(srcDir, "sgiddir"), 0o755))
	must(unix.Chmod(filepath.Join(srcDir, "sgiddir"), 0o2775))
	must(unix.Mknod(filepath.Join(srcDir, "mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))))
	must(unix.Mknod(filepath.Join(srcDir, "disk"), unix.S_IFBLK|0o666, int(unix.Mkdev(7, 0))))
	must(unix.Mkfifo(filepath.Join(srcDir, "fifo"), 0o644))
	must(unix.Mknod(filepath.Join(srcDir, "gone"), unix.S_IFCHR, 0)) // a whiteout
	must(os.WriteFile(filepath.Join(srcDir, "a"), []byte("shared"), 0o644))
	must(os.Link(filepath.Join(srcDir, "a"), filepath.Join(srcDir, "b")))
	must(os.Symlink("/etc/shadow", filepath.Join(srcDir, "link")))
	must(os.Lchown(filepath.Join(srcDir, "a"), 1234, 5678))
	must(unix.Setxattr(filepath.Join(srcDir, "a"), "security.capability", []byte{1, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0))
	must(unix.Setxattr(filepath.Join(srcDir, "sgiddir"), "trusted.overlay.opaque", []byte("y"), 0))
	src, err := Open(srcDir)
	must(err)
	defer src.Close()
	dstDir := t.TempDir()
	dst, err := Open(dstDir)
	must(err)
	defer dst.Close()
	st, err := CopyTree(src, dst)
	must(err)
	if st.Skipped != 3 {
		t.Errorf("skipped %d, want 3 (two devices and a fifo)", st.Skipped)
	}
	for _, n := range []string{"mem", "disk", "fifo"} {
		if _, err := os.Lstat(filepath.Join(dstDir, n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s materialised on the host: %v", n, err)
		}
	}
	var s unix.Stat_t
	must(unix.Lstat(filepath.Join(dstDir, "suid"), &s))
	if s.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 || s.Mode&0o777 != 0o755 {
		t.Errorf("suid copied as %o", s.Mode)
	}
	must(unix.Lstat(filepath.Join(dstDir, "sgiddir"), &s))
	if s.Mode&unix.S_ISGID != 0 {
		t.Errorf("setgid dir copied as %o", s.Mode)
	}
	if v, err := unix.Getxattr(filepath.Join(dstDir, "sgiddir"), "trusted.overlay.opaque", make([]byte, 8)); err != nil || v != 1 {
		t.Errorf("opaque mark lost: %d %v", v, err)
	}
	if _, err := unix.Getxattr(filepath.Join(dstDir, "a"), "security.capability", make([]byte, 64)); err == nil {
		t.Error("file capabilities reached the host")
	}
	must(unix.Lstat(filepath.Join(dstDir, "gone"), &s))
	if s.Mode&unix.S_IFMT != unix.S_IFCHR || s.Rdev != 0 {
		t.Errorf("whiteout lost: %o %d", s.Mode, s.Rdev)
	}
	var sa, sb unix.Stat_t
	must(unix.Lstat(filepath.Join(dstDir, "a"), &sa))
	must(unix.Lstat(filepath.Join(dstDir, "b"), &sb))
	if sa.Ino != sb.Ino || sa.Uid != 1234 || sa.Gid != 5678 {
		t.Errorf("hard link or owner lost: %+v %+v", sa, sb)
	}
	if target, _ := os.Readlink(filepath.Join(dstDir, "link")); target != "/etc/shadow" {
		t.Errorf("link target %q", target)
	}
}

// TestEnsureMountPoints: what is mounted at /tmp or /etc/resolv.conf never lands where a
// planted link points.
func TestEnsureMountPoints(t *testing.T) {
	r, dir, secret := hostile(t)
	if err := os.Symlink("/", filepath.Join(dir, "tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	if err := r.EnsureDir("tmp", 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := r.EnsureFile("etc/resolv.conf", 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.EnsureDir("hostroot/space", 0o755); err != nil {
		t.Fatal(err)
	}
	for p, dirWant := range map[string]bool{"tmp": true, "hostroot/space": true, "etc/resolv.conf": false} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil || fi.IsDir() != dirWant || fi.Mode()&fs.ModeSymlink != 0 {
			t.Errorf("%s: %v, %v", p, fi.Mode(), err)
		}
	}
	if b, _ := os.ReadFile(secret); string(b) != canary {
		t.Fatal("host file changed")
	}
	if _, err := os.Stat("/space"); err == nil {
		t.Fatal("made /space on the host")
	}
}

// FuzzResolve: whatever path is asked of a tree full of links out, nothing outside it is read,
// written or described.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"etc/ok", "rel", "hostroot/etc/passwd", "../secret", "magic", "inner/ok", "etc/ssl/certs/ca-certificates.crt", "a/../b", "//x", "etc\x00", ".", ""} {
		f.Add(s)
	}
	r, dir, secret := hostile(f)
	f.Fuzz(func(t *testing.T, p string) {
		if b, err := r.ReadFile(p, 1<<16); err == nil && bytes.Contains(b, []byte(canary)) {
			t.Fatalf("ReadFile(%q) read the host file", p)
		}
		if info, err := r.Lstat(p); err == nil && info.Ino != 0 {
			var st unix.Stat_t
			if unix.Stat(secret, &st) == nil && st.Ino == info.Ino && st.Dev == info.Dev {
				t.Fatalf("Lstat(%q) described the host file", p)
			}
		}
		c, err := Clean(p)
		first, _, _ := strings.Cut(c, "/")
		if _, ferr := r.Lstat(first); err == nil && c != "" && errors.Is(ferr, fs.ErrNotExist) {
			// Writes: either inside the tree or refused.
			if err := r.WriteFile(c, []byte("w"), 0o644); err == nil {
				if _, err := os.Lstat(filepath.Join(dir, c)); err != nil {
					t.Fatalf("WriteFile(%q) wrote outside the tree: %v", c, err)
				}
				r.RemoveAll(c)
			}
		}
		if b, _ := os.ReadFile(secret); string(b) != canary {
			t.Fatalf("host file changed by %q", p)
		}
	})
}
