package server

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func tarOf(t *testing.T, files map[string]string) *tar.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		if strings.HasSuffix(name, "/") {
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(1e9, 0)})
			continue
		}
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o640, Size: int64(len(body)), ModTime: time.Unix(1e9, 0)})
		tw.Write([]byte(body))
	}
	tw.Close()
	return tar.NewReader(&buf)
}

func TestExtractReplacesOnlyNamedPaths(t *testing.T) {
	root := t.TempDir()
	a := filepath.Join(root, "a")
	os.MkdirAll(a, 0o755)
	os.WriteFile(filepath.Join(a, "old"), []byte("old"), 0o644)
	os.WriteFile(filepath.Join(root, "keep"), []byte("keep"), 0o644)
	rel := strings.TrimPrefix(a, "/")
	os.RemoveAll(a) // what the handler does first
	n, err := extract(tarOf(t, map[string]string{rel + "/": "", rel + "/new": "new"}), []string{a})
	if err != nil || n != 2 {
		t.Fatalf("extract: %d, %v", n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(a, "new")); string(b) != "new" {
		t.Fatalf("new = %q", b)
	}
	if fi, err := os.Stat(filepath.Join(a, "new")); err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(time.Unix(1e9, 0)) {
		t.Fatalf("new: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(a, "old")); err == nil {
		t.Fatal("old survived")
	}
	if b, _ := os.ReadFile(filepath.Join(root, "keep")); string(b) != "keep" {
		t.Fatal("a path not named was touched")
	}
	if _, err := extract(tarOf(t, map[string]string{strings.TrimPrefix(root, "/") + "/escape": "x"}), []string{a}); err == nil {
		t.Fatal("entry outside the restored paths accepted")
	}
	if _, err := os.Stat(filepath.Join(root, "escape")); err == nil {
		t.Fatal("entry outside the restored paths written")
	}
}

// TestExtractDeepAndStrangeNames: a tree deeper than PATH_MAX and names that are not UTF-8 come
// back through a restore.
func TestExtractDeepAndStrangeNames(t *testing.T) {
	root := t.TempDir()
	a := filepath.Join(root, "a")
	rel := strings.TrimPrefix(a, "/")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := rel
	tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX})
	for range 30 { // 30 × 201 bytes: past PATH_MAX
		dir += "/" + strings.Repeat("d", 200)
		tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX})
	}
	odd := dir + "/n\xffame\x01"
	tw.WriteHeader(&tar.Header{Name: odd, Typeflag: tar.TypeReg, Mode: 0o600, Size: 4, Format: tar.FormatPAX})
	tw.Write([]byte("deep"))
	tw.WriteHeader(&tar.Header{Name: rel + "/sibling", Typeflag: tar.TypeSymlink, Linkname: "l\xfe", Format: tar.FormatPAX})
	tw.Close()
	n, err := extract(tar.NewReader(&buf), []string{a})
	if err != nil || n != 33 {
		t.Fatalf("extract: %d, %v", n, err)
	}
	if target, err := os.Readlink(filepath.Join(a, "sibling")); err != nil || target != "l\xfe" {
		t.Fatalf("link: %q %v", target, err)
	}
	// Read the deep file back relative to its directory (its full path is too long for open).
	d, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cur := d
	for _, c := range strings.Split(strings.TrimPrefix(odd, strings.TrimPrefix(root, "/")+"/"), "/")[:31] {
		next, err := cur.OpenRoot(c)
		if err != nil {
			t.Fatal(err)
		}
		if cur != d {
			cur.Close()
		}
		cur = next
	}
	b, err := cur.ReadFile("n\xffame\x01")
	if err != nil || string(b) != "deep" {
		t.Fatalf("deep file: %q %v", b, err)
	}
	os.RemoveAll(a)
}
