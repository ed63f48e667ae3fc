package fstree

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/confine"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// layerDir builds a writable layer like overlayfs leaves one: files, a symlink, a setuid file,
// a whiteout and an opaque directory.
func layerDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for whiteouts and trusted xattrs")
	}
	d := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(d, "work/sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(d, "work/data.csv"), bytes.Repeat([]byte("a,b\n"), 50000), 0o644))
	must(t, os.WriteFile(filepath.Join(d, "work/sub/x"), []byte("x"), 0o600))
	must(t, os.WriteFile(filepath.Join(d, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(t, unix.Chmod(filepath.Join(d, "suid"), 0o4755))
	must(t, os.Symlink("work/data.csv", filepath.Join(d, "link")))
	must(t, unix.Mknod(filepath.Join(d, "gone"), unix.S_IFCHR, 0))
	must(t, os.Mkdir(filepath.Join(d, "opq"), 0o755))
	must(t, unix.Setxattr(filepath.Join(d, "opq"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, os.WriteFile(filepath.Join(d, "opq/new"), []byte("new"), 0o644))
	must(t, os.Chown(filepath.Join(d, "work/sub/x"), 1000, 1000))
	return d
}

func capture(t *testing.T, s *cas.Store, dir, name string, prev Tree) (Tree, int64) {
	t.Helper()
	tx := s.Begin()
	tr, err := Capture(tx, dir, prev.Index(), prev.CapturedAt)
	must(t, err)
	data, err := json.Marshal(tr)
	must(t, err)
	n, err := tx.Commit(name, data, tr.Chunks())
	must(t, err)
	return tr, tx.Stored() + n
}

// comparable drops what differs between a tree and its copy on the host.
func comparable(tr Tree) []Entry {
	var out []Entry
	for _, e := range tr.Entries {
		e.Ino, e.CTime, e.layer = 0, 0, ""
		out = append(out, e)
	}
	return out
}

func TestCaptureMaterialize(t *testing.T) {
	d := layerDir(t)
	s, err := cas.Open(t.TempDir(), nil)
	must(t, err)
	tr, _ := capture(t, s, d, "a", Tree{})
	out := t.TempDir()
	must(t, Materialize(s, tr, out))
	back, _ := capture(t, s, out, "b", Tree{})
	// The host copy is the tree less what the host must never hold: set-id bits.
	want := comparable(tr)
	for i := range want {
		want[i].Mode &^= 0o6000
	}
	if !reflect.DeepEqual(want, comparable(back)) {
		t.Fatalf("materialized tree differs:\n%+v\n%+v", want, comparable(back))
	}
	if !tr.Index()["gone"].Whiteout() || !tr.Index()["opq"].Opaque() {
		t.Fatal("whiteout or opaque directory not recorded")
	}
	if tr.Index()["suid"].Mode != 0o4755 || tr.Index()["work/sub/x"].UID != 1000 {
		t.Fatal("setuid bit or owner not recorded")
	}
	got, _ := os.ReadFile(filepath.Join(out, "work/data.csv"))
	if len(got) != 200000 {
		t.Fatalf("data.csv has %d bytes", len(got))
	}
}

func TestCaptureReusesUnchanged(t *testing.T) {
	d := layerDir(t)
	s, err := cas.Open(t.TempDir(), nil)
	must(t, err)
	first, _ := capture(t, s, d, "a", Tree{})
	first.CapturedAt = time.Now().Add(time.Second) // as if long ago relative to the files' ctimes
	must(t, os.WriteFile(filepath.Join(d, "work/sub/x"), []byte("changed"), 0o600))
	// A file changed in place with the same size and mtime would fool a stat cache, but not a
	// ctime check; make a change invisible to size and mtime.
	st, _ := os.Stat(filepath.Join(d, "suid"))
	must(t, os.WriteFile(filepath.Join(d, "suid"), []byte("#!/bin/XX\n"), 0o755))
	must(t, os.Chtimes(filepath.Join(d, "suid"), st.ModTime(), st.ModTime()))
	second, stored := capture(t, s, d, "b", first)
	idx := second.Index()
	if idx["work/data.csv"].Chunks[0] != first.Index()["work/data.csv"].Chunks[0] {
		t.Fatal("unchanged file has different chunks")
	}
	var buf bytes.Buffer
	_, err = s.WriteTo(&buf, idx["suid"].Chunks)
	must(t, err)
	if buf.String() != "#!/bin/XX\n" {
		t.Fatalf("change with same size and mtime missed: %q", buf.String())
	}
	if stored > 8192 {
		t.Fatalf("second capture stored %d bytes for two tiny changes", stored)
	}
}

func TestViewAndTar(t *testing.T) {
	d := layerDir(t)
	lower := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(lower, "opq"), 0o755))
	must(t, os.WriteFile(filepath.Join(lower, "opq/old"), []byte("old"), 0o644))
	must(t, os.WriteFile(filepath.Join(lower, "gone"), []byte("lower"), 0o644))
	must(t, os.MkdirAll(filepath.Join(lower, "work"), 0o755))
	must(t, os.WriteFile(filepath.Join(lower, "work/base.txt"), []byte("base"), 0o644))
	s, err := cas.Open(t.TempDir(), nil)
	must(t, err)
	tr, _ := capture(t, s, d, "a", Tree{})
	v := NewView(TreeLayer(tr), DirLayer(lower))
	if _, ok, _ := v.Lookup("gone"); ok {
		t.Fatal("whiteout did not hide the lower file")
	}
	if _, ok, _ := v.Lookup("opq/old"); ok {
		t.Fatal("opaque directory did not hide the lower file")
	}
	names, err := v.List("work")
	must(t, err)
	if !reflect.DeepEqual(names, []string{"base.txt", "data.csv", "sub"}) {
		t.Fatalf("work lists %v", names)
	}
	var buf bytes.Buffer
	must(t, WriteTar(&buf, s, v, []string{"work", "opq", "gone"}))
	tr2 := tar.NewReader(&buf)
	got := map[string]string{}
	for {
		h, err := tr2.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		b, _ := io.ReadAll(tr2)
		got[h.Name] = string(b)
	}
	want := []string{"work/", "work/base.txt", "work/data.csv", "work/sub/", "work/sub/x", "opq/", "opq/new"}
	if len(got) != len(want) {
		t.Fatalf("tar holds %v", got)
	}
	for _, n := range want {
		if _, ok := got[n]; !ok {
			t.Fatalf("tar lacks %s: %v", n, got)
		}
	}
	if got["work/base.txt"] != "base" || got["opq/new"] != "new" {
		t.Fatal("wrong content in tar")
	}
}

func TestDiff(t *testing.T) {
	d := layerDir(t)
	s, err := cas.Open(t.TempDir(), nil)
	must(t, err)
	a, _ := capture(t, s, d, "a", Tree{})
	must(t, os.WriteFile(filepath.Join(d, "work/data.csv"), []byte("new"), 0o644))
	must(t, os.Remove(filepath.Join(d, "work/sub/x")))
	must(t, os.WriteFile(filepath.Join(d, "added"), []byte("12345"), 0o644))
	must(t, os.Remove(filepath.Join(d, "gone"))) // the lower file is back
	b, _ := capture(t, s, d, "b", a)
	inLower := func(p string) bool { return p == "gone" }
	got := Diff(a, b, inLower)
	want := []Change{
		{Path: "/added", Op: "added", Size: 5},
		{Path: "/gone", Op: "added"},
		{Path: "/work/data.csv", Op: "modified", Size: 3},
		{Path: "/work/sub/x", Op: "deleted", Size: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("diff:\n got %+v\nwant %+v", got, want)
	}
}

// TestStrangeNamesRoundTrip: names and link targets that are not UTF-8, and paths deeper than
// PATH_MAX, come back byte for byte through a capture, its JSON and a write-back.
func TestStrangeNamesRoundTrip(t *testing.T) {
	d := t.TempDir()
	deep := filepath.Join(d, strings.Repeat(strings.Repeat("x", 250)+"/", 20))
	r, err := confine.Open(d)
	must(t, err)
	defer r.Close()
	rel := strings.TrimSuffix(strings.TrimPrefix(deep, d+"/"), "/")
	must(t, r.MkdirAll(rel, 0o755))
	odd := rel + "/n\xff\xfeame"
	must(t, r.WriteFile(odd, []byte("data"), 0o644))
	must(t, r.Symlink("t\xffarget", "link"))
	s, err := cas.Open(t.TempDir(), nil)
	must(t, err)
	tr, _ := capture(t, s, d, "a", Tree{})
	b, err := json.Marshal(tr)
	must(t, err)
	var back Tree
	must(t, json.Unmarshal(b, &back))
	if !reflect.DeepEqual(comparable(tr), comparable(back)) {
		t.Fatal("the tree changed through JSON")
	}
	out := t.TempDir()
	must(t, Materialize(s, back, out))
	ro, err := confine.Open(out)
	must(t, err)
	defer ro.Close()
	if got, err := ro.ReadFile(odd, 10); err != nil || string(got) != "data" {
		t.Fatalf("deep odd file: %q, %v", got, err)
	}
	if target, err := ro.Readlink("link"); err != nil || target != "t\xffarget" {
		t.Fatalf("odd link: %q, %v", target, err)
	}
}

// FuzzMaterialize writes hostile trees (any paths, types and link targets, links first so that
// later entries try to go through them) and checks that nothing outside the directory changes.
func FuzzMaterialize(f *testing.F) {
	f.Add("l", "l", "/", "l/etc/x", "f", "")
	f.Add("a", "l", "..", "a/b", "d", "")
	f.Add("../x", "f", "", "x", "f", "")
	f.Add("d", "d", "", "d/c", "c", "")
	f.Add("p", "p", "", "s", "l", "/proc/self/root/etc/shadow")
	s, err := cas.Open(f.TempDir(), nil)
	must(f, err)
	tx := s.Begin()
	chunks, err := tx.Put(strings.NewReader("content"))
	must(f, err)
	if _, err := tx.Commit("c", []byte("{}"), nil); err != nil {
		f.Fatal(err)
	}
	outside := f.TempDir()
	sentinel := filepath.Join(outside, "sentinel")
	must(f, os.WriteFile(sentinel, []byte("keep"), 0o644))
	f.Fuzz(func(t *testing.T, p1, t1, l1, p2, t2, l2 string) {
		dir := filepath.Join(t.TempDir(), "tree")
		must(t, os.Mkdir(dir, 0o755))
		tr := Tree{}
		for _, e := range []Entry{{Path: p1, Type: t1, Target: l1}, {Path: p2, Type: t2, Target: l2}} {
			e.Mode = 0o6755
			if e.Type == "l" && e.Target == "" {
				e.Target = outside
			}
			if e.Type == "f" {
				e.Chunks = chunks
				e.Size = 7
			}
			tr.Entries = append(tr.Entries, e)
		}
		Materialize(s, tr, dir) // errors are fine; escapes are not
		if entries, _ := os.ReadDir(outside); len(entries) != 1 {
			t.Fatalf("something was made beside the tree: %v", entries)
		}
		if b, _ := os.ReadFile(sentinel); string(b) != "keep" {
			t.Fatal("the file beside the tree changed")
		}
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			info, err := d.Info()
			if err == nil && info.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeNamedPipe) != 0 {
				t.Fatalf("%s materialised as %v", p, info.Mode())
			}
			if err == nil && info.Mode()&fs.ModeDevice != 0 {
				if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Rdev != 0 {
					t.Fatalf("%s materialised as a device", p)
				}
			}
			return nil
		})
	})
}

// TestDeepTreeDiffAndTar: a tree 2100 directories deep is diffed against a directory layer and
// written as a tar (restore by paths) without an ancestor walk per path per layer.
func TestDeepTreeDiffAndTar(t *testing.T) {
	lowerDir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(lowerDir, "root"), 0o755))
	up := t.TempDir()
	r, err := confine.Open(up)
	must(t, err)
	defer r.Close()
	p := "root/rt"
	for range 2100 {
		p += "/d"
	}
	must(t, r.MkdirAll(p, 0o755))
	must(t, r.WriteFile(p+"/f", []byte("x"), 0o644))
	s, err := cas.Open(t.TempDir(), nil)
	must(t, err)
	b, _ := capture(t, s, up, "b", Tree{})
	lower := NewView(DirLayer(lowerDir))
	changes := Diff(Tree{}, b, func(p string) bool {
		_, ok, err := lower.Lookup(p)
		return ok && err == nil
	})
	if len(changes) != 2102 || changes[len(changes)-1].Op != "added" {
		t.Fatalf("%d changes", len(changes))
	}
	view := NewView(TreeLayer(b), DirLayer(lowerDir))
	var buf bytes.Buffer
	must(t, WriteTar(&buf, s, view, []string{"root/rt"}))
	tr := tar.NewReader(&buf)
	n := 0
	for {
		if _, err := tr.Next(); err != nil {
			break
		}
		n++
	}
	if n != 2102 {
		t.Fatalf("tar of the deep tree: %d entries", n)
	}
}
