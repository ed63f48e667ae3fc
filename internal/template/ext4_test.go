package template

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/testutil"
)

// TestExportExt4: a built template (minimal plus a layer that adds a file and deletes one) as an
// ext4 image, mounted read-only, has exactly the template's files.
func TestExportExt4(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	s, _ := newStore(t, "/bin/busybox")
	minimal, err := s.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	layer, _, err := s.LayerPath("3333333333333333")
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(layer, "app"), 0o755)
	os.WriteFile(filepath.Join(layer, "app/hello.txt"), []byte("hello\n"), 0o600)
	os.MkdirAll(filepath.Join(layer, "bin"), 0o755)
	if err := unix.Mknod(filepath.Join(layer, "bin/ls"), unix.S_IFCHR, 0); err != nil { // an overlayfs whiteout
		t.Fatal(err)
	}
	if _, err := s.Save(ctx, Template{Name: "layered", RootFS: minimal.RootFS, Layers: []string{layer}, Parent: "minimal"}); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "layered.ext4")
	if err := s.ExportExt4(ctx, "layered", img); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop,ro", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })

	want := tree(t, minimal.RootFS)
	delete(want, "bin/ls")
	want["app"] = "dir 755"
	want["app/hello.txt"] = "file 600 hello\n"
	got := tree(t, mnt)
	delete(got, "lost+found")
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: image has %q, want %q", p, got[p], w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: in the image, not in the template", p)
		}
	}
	if err := s.ExportExt4(ctx, "layered", img); err == nil {
		t.Error("export over an existing file succeeded")
	}
}

// tree describes every entry under root: type, permissions and content or link target.
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "link " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %o", fi.Mode().Perm())
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if len(b) > 64 {
				b = bytes.Clone(b[:64])
			}
			out[rel] = fmt.Sprintf("file %o %s", fi.Mode().Perm(), b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
