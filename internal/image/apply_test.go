package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/errdefs"
)

// ent is one tar entry of a test layer.
type ent struct {
	name string
	typ  byte // tar.Type*; 0 means a regular file
	body string
	link string
	mode int64 // 0 means 0644 (files) or 0755 (directories)
	uid  int
	gid  int
	// devices
	major, minor int64
}

var testTime = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

// tarBytes builds an uncompressed layer tarball.
func tarBytes(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{
			Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: testTime, Devmajor: e.major, Devminor: e.minor, Format: tar.FormatPAX,
		}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatalf("tar body %q: %v", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sandboxDirs makes base/{root,sentinel/keep} and returns base, root and the sentinel.
func sandboxDirs(t testing.TB) (base, root, sentinel string) {
	t.Helper()
	base = t.TempDir()
	t.Cleanup(func() { makeWritable(base) }) // runs before TempDir's removal
	root, sentinel = filepath.Join(base, "root"), filepath.Join(base, "sentinel")
	for _, d := range []string{root, sentinel} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sentinel, "keep"), []byte("sentinel"), 0o644); err != nil {
		t.Fatal(err)
	}
	return base, root, sentinel
}

// makeWritable lets a non-root cleanup delete trees with read-only directories.
func makeWritable(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
}

// describe returns one line per file under dir (not dir itself): type, mode, mtime and content or
// link target. With owners, uid:gid is included.
func describe(t testing.TB, dir string, owners bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		s := fmt.Sprintf("%s %s", fi.Mode(), fi.ModTime().UTC().Format(time.RFC3339))
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			s += " -> " + target
		}
		if owners {
			st := fi.Sys().(*syscall.Stat_t)
			s += fmt.Sprintf(" %d:%d", st.Uid, st.Gid)
		}
		out[rel] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// listing is the sorted names directly under dir.
func listing(t testing.TB, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func newApplier(t testing.TB, root string) *applier {
	t.Helper()
	r, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &applier{root: r, log: slog.New(slog.DiscardHandler), chown: true}
}

// TestApplyRefusesEscapes applies malicious layers in order and checks that each is refused
// with an error naming the entry, and that nothing outside the root changed.
func TestApplyRefusesEscapes(t *testing.T) {
	type tc struct {
		name   string
		layers func(sentinel string) [][]ent
		entry  string // the entry the error must name; "" means the layers apply cleanly
		check  func(t *testing.T, root, sentinel string)
	}
	sym := func(name, target string) ent { return ent{name: name, typ: tar.TypeSymlink, link: target} }
	file := func(name, body string) ent { return ent{name: name, body: body} }
	cases := []tc{
		{name: "dotdot", layers: func(string) [][]ent { return [][]ent{{file("../escape", "x")}} }, entry: "../escape"},
		{name: "dotdot inside", layers: func(string) [][]ent { return [][]ent{{file("a/../../escape", "x")}} }, entry: "a/../../escape"},
		{name: "absolute", layers: func(string) [][]ent { return [][]ent{{file("/abs", "x")}} }, entry: "/abs"},
		{name: "absolute symlink then write, one layer", layers: func(s string) [][]ent {
			return [][]ent{{sym("s", s), file("s/pwn", "x")}}
		}, entry: "s/pwn"},
		{name: "relative symlink then write, one layer", layers: func(string) [][]ent {
			return [][]ent{{sym("s", "../sentinel"), file("s/pwn", "x")}}
		}, entry: "s/pwn"},
		{name: "symlink then write, across layers", layers: func(s string) [][]ent {
			return [][]ent{{sym("a", s)}, {file("a/keep", "pwned")}}
		}, entry: "a/keep"},
		{name: "symlink chain", layers: func(string) [][]ent {
			return [][]ent{{sym("b", "../sentinel"), sym("a", "b")}, {file("a/pwn", "x")}}
		}, entry: "a/pwn"},
		{name: "symlink deep in a subdirectory", layers: func(string) [][]ent {
			return [][]ent{{ent{name: "d", typ: tar.TypeDir}, sym("d/up", "../../sentinel")}, {file("d/up/pwn", "x")}}
		}, entry: "d/up/pwn"},
		{name: "directory through symlink", layers: func(string) [][]ent {
			return [][]ent{{sym("s", "../sentinel")}, {ent{name: "s/sub", typ: tar.TypeDir}}}
		}, entry: "s/sub"},
		{name: "hardlink to outside", layers: func(string) [][]ent {
			return [][]ent{{ent{name: "h", typ: tar.TypeLink, link: "../sentinel/keep"}}}
		}, entry: "h"},
		{name: "hardlink to absolute", layers: func(s string) [][]ent {
			return [][]ent{{ent{name: "h", typ: tar.TypeLink, link: filepath.Join(s, "keep")}}}
		}, entry: "h"},
		{name: "hardlink through symlink", layers: func(string) [][]ent {
			return [][]ent{{sym("s", "../sentinel")}, {ent{name: "h", typ: tar.TypeLink, link: "s/keep"}}}
		}, entry: "h"},
		{name: "whiteout through symlink", layers: func(string) [][]ent {
			return [][]ent{{sym("s", "../sentinel")}, {file("s/.wh.keep", "")}}
		}, entry: "s/.wh.keep"},
		{name: "opaque whiteout through symlink", layers: func(string) [][]ent {
			return [][]ent{{sym("s", "../sentinel")}, {file("s/.wh..wh..opq", "")}}
		}, entry: "s/.wh..wh..opq"},
		{name: "whiteout of parent", layers: func(string) [][]ent { return [][]ent{{file(".wh..", "")}} }, entry: ".wh.."},
		{name: "root replaced by a file", layers: func(string) [][]ent { return [][]ent{{file(".", "")}} }, entry: "."},
		// The final component is never followed: these replace the symlink instead.
		{name: "file over symlink replaces it", layers: func(string) [][]ent {
			return [][]ent{{sym("s", "../sentinel/keep")}, {file("s", "mine")}}
		}, check: func(t *testing.T, root, _ string) {
			if b, err := os.ReadFile(filepath.Join(root, "s")); err != nil || string(b) != "mine" {
				t.Errorf("s = %q, %v; want the layer's file", b, err)
			}
		}},
		{name: "directory over symlink replaces it", layers: func(string) [][]ent {
			return [][]ent{{sym("s", "../sentinel")}, {ent{name: "s", typ: tar.TypeDir}, file("s/f", "in")}}
		}, check: func(t *testing.T, root, _ string) {
			if fi, err := os.Lstat(filepath.Join(root, "s")); err != nil || !fi.IsDir() {
				t.Errorf("s is not a directory: %v", err)
			}
		}},
		{name: "symlink inside the root is followed", layers: func(string) [][]ent {
			return [][]ent{{ent{name: "usr/bin", typ: tar.TypeDir}, sym("bin", "usr/bin")}, {file("bin/sh", "sh")}}
		}, check: func(t *testing.T, root, _ string) {
			if b, err := os.ReadFile(filepath.Join(root, "usr/bin/sh")); err != nil || string(b) != "sh" {
				t.Errorf("usr/bin/sh = %q, %v", b, err)
			}
		}},
		{name: "device nodes skipped", layers: func(string) [][]ent {
			return [][]ent{{ent{name: "dev/null", typ: tar.TypeChar, major: 1, minor: 3}, ent{name: "dev/sda", typ: tar.TypeBlock, major: 8}}}
		}, check: func(t *testing.T, root, _ string) {
			if _, err := os.Lstat(filepath.Join(root, "dev/null")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("dev/null exists (err %v); device nodes must be skipped", err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base, root, sentinel := sandboxDirs(t)
			before := describe(t, sentinel, false)
			a := newApplier(t, root)
			var err error
			for i, l := range c.layers(sentinel) {
				if err = a.applyLayer(context.Background(), bytes.NewReader(tarBytes(t, l...))); err != nil {
					t.Logf("layer %d: %v", i, err)
					break
				}
			}
			switch {
			case c.entry == "" && err != nil:
				t.Fatalf("apply: %v", err)
			case c.entry != "" && err == nil:
				t.Fatalf("apply succeeded; want entry %q refused", c.entry)
			case c.entry != "":
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("error %v does not wrap ErrInvalidArgument", err)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("%q", c.entry)) {
					t.Errorf("error %q does not name entry %q", err, c.entry)
				}
			}
			if diff := cmp.Diff(before, describe(t, sentinel, false)); diff != "" {
				t.Errorf("sentinel changed (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"root", "sentinel"}, listing(t, base)); diff != "" {
				t.Errorf("files appeared next to the root (-want +got):\n%s", diff)
			}
			if c.check != nil {
				c.check(t, root, sentinel)
			}
		})
	}
}

// TestApplyWhiteouts checks whiteouts against lower layers and entries of the same layer.
func TestApplyWhiteouts(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	a := newApplier(t, root)
	layers := [][]ent{
		{
			{name: "d", typ: tar.TypeDir}, {name: "d/a", body: "a"}, {name: "d/sub", typ: tar.TypeDir},
			{name: "d/sub/x", body: "x"}, {name: "o", typ: tar.TypeDir}, {name: "o/old", body: "old"},
			{name: "o/olddir", typ: tar.TypeDir}, {name: "o/olddir/f", body: "f"}, {name: "keep", body: "k"},
		},
		{
			{name: "d", typ: tar.TypeDir}, {name: "d/.wh.sub"}, {name: "d/.wh.missing"},
			// Opaque marker after a same-layer entry: that entry survives, lower ones go.
			{name: "o", typ: tar.TypeDir}, {name: "o/new", body: "new"}, {name: "o/.wh..wh..opq"},
			// A whiteout and a re-creation of the same name in one layer: the new file stays.
			{name: "d/a", body: "a2"}, {name: "d/.wh.a"},
		},
	}
	for i, l := range layers {
		if err := a.applyLayer(context.Background(), bytes.NewReader(tarBytes(t, l...))); err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
	}
	ts := testTime.Format(time.RFC3339)
	want := map[string]string{
		"d":     "drwxr-xr-x " + ts,
		"d/a":   "-rw-r--r-- " + ts + " a2",
		"o":     "drwxr-xr-x " + ts,
		"o/new": "-rw-r--r-- " + ts + " new",
		"keep":  "-rw-r--r-- " + ts + " k",
	}
	if diff := cmp.Diff(want, describe(t, root, false)); diff != "" {
		t.Errorf("tree (-want +got):\n%s", diff)
	}
}

// FuzzApplyLayer feeds arbitrary bytes to the applier: it must never panic and never create,
// change or delete anything outside its root.
func FuzzApplyLayer(f *testing.F) {
	seeds := [][]ent{
		{{name: "s", typ: tar.TypeSymlink, link: "../sentinel"}, {name: "s/pwn", body: "x"}},
		{{name: "s", typ: tar.TypeSymlink, link: "/"}, {name: "s/tmp/pwn", body: "x"}},
		{{name: "h", typ: tar.TypeLink, link: "../sentinel/keep"}},
		{{name: "d", typ: tar.TypeDir}, {name: "d/.wh..wh..opq"}, {name: "d/f", body: "f"}, {name: ".wh.d"}},
		{{name: "a", typ: tar.TypeSymlink, link: "b"}, {name: "b", typ: tar.TypeSymlink, link: "a"}, {name: "a/x", body: "x"}},
		{{name: "f", typ: tar.TypeFifo}, {name: "dir", typ: tar.TypeDir, mode: 0o500}, {name: "dir/x", body: "y"}},
		{{name: "../x", body: "x"}, {name: "x", typ: tar.TypeLink, link: "x"}},
	}
	for _, s := range seeds {
		f.Add(tarBytes(f, s...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Refuse inputs that declare huge files: they only exercise the disk.
		tr := tar.NewReader(bytes.NewReader(data))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if h.Size > 1<<20 {
				t.Skip("entry too large for a fuzz run")
			}
		}
		base, root, sentinel := sandboxDirs(t)
		before := describe(t, sentinel, false)
		a := newApplier(t, root)
		_ = a.applyLayer(context.Background(), bytes.NewReader(data))
		if diff := cmp.Diff(before, describe(t, sentinel, false)); diff != "" {
			t.Fatalf("sentinel changed (-before +after):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"root", "sentinel"}, listing(t, base)); diff != "" {
			t.Fatalf("files appeared next to the root (-want +got):\n%s", diff)
		}
	})
}

// TestLayerCannotFillTheDisk: zeros become holes, and data past the image's limit is refused.
func TestLayerCannotFillTheDisk(t *testing.T) {
	a := newApplier(t, t.TempDir())
	a.limit = 1 << 20
	hdr := func(name string, size int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: testTime}
	}
	zeros := io.LimitReader(zeroReader{}, 1<<30)
	st := &layerState{seen: map[string]bool{}, dirs: map[string]*tar.Header{}}
	if err := a.applyEntry(hdr("sparse", 1<<30), io.MultiReader(zeros, strings.NewReader("end")), st); err != nil {
		t.Fatal(err)
	}
	var s unix.Stat_t
	if err := unix.Stat(filepath.Join(a.root.Name(), "sparse"), &s); err != nil {
		t.Fatal(err)
	}
	if s.Size != 1<<30+3 || s.Blocks*512 > 1<<20 {
		t.Fatalf("a 1 GiB file of zeros: size %d, %d bytes on disk", s.Size, s.Blocks*512)
	}
	data := bytes.Repeat([]byte{1}, 2<<20)
	err := a.applyEntry(hdr("big", int64(len(data))), bytes.NewReader(data), st)
	var rf *refusal
	if !errors.As(err, &rf) {
		t.Fatalf("2 MiB of data past a 1 MiB limit: %v", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}
