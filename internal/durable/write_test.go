package durable

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/testutil"
)

// leftovers lists what is in dir besides the names in want.
func leftovers(t *testing.T, dir string, want ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var extra []string
	for _, e := range ents {
		if !slices.Contains(want, e.Name()) {
			extra = append(extra, e.Name())
		}
	}
	return extra
}

func TestWriteFileReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	if err := os.WriteFile(p, bytes.Repeat([]byte("old "), 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "new\n" { // no tail of the longer old file
		t.Fatalf("content %q, %v; want %q", b, err, "new\n")
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600 (the old file's 0644 must not survive)", fi.Mode().Perm())
	}
	if extra := leftovers(t, dir, "key"); len(extra) > 0 {
		t.Fatalf("temporary files left: %v", extra)
	}
}

// A reader never sees a part: while one goroutine rewrites the file with two contents of
// different lengths, every read is one of them whole.
func TestWriteFileNoPartialVisible(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state")
	a, b := bytes.Repeat([]byte("a"), 256<<10), bytes.Repeat([]byte("b"), 3)
	if err := WriteFile(p, a, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		for i := range 50 {
			data := a
			if i%2 == 0 {
				data = b
			}
			if err := WriteFile(p, data, 0o600); err != nil {
				t.Error(err)
				return
			}
		}
	})
	reads := 0
	for {
		select {
		case <-done:
			wg.Wait()
			if reads == 0 {
				t.Fatal("no read while writing")
			}
			t.Logf("%d reads while 50 writes ran, each whole", reads)
			return
		default:
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read during rewrite: %v (the name must always be there)", err)
		}
		if !bytes.Equal(got, a) && !bytes.Equal(got, b) {
			t.Fatalf("read %d bytes that are neither content whole", len(got))
		}
		reads++
	}
}

// A write that fails before the rename leaves the old file as it was and no temporary file.
func TestWriteFileFailureLeavesOld(t *testing.T) {
	dir := t.TempDir()
	// The rename fails: path is a non-empty directory.
	p := filepath.Join(dir, "d")
	os.MkdirAll(filepath.Join(p, "x"), 0o755)
	if err := WriteFile(p, []byte("data"), 0o600); err == nil {
		t.Fatal("WriteFile over a directory succeeded")
	}
	if extra := leftovers(t, dir, "d"); len(extra) > 0 {
		t.Fatalf("temporary files left after a failed rename: %v", extra)
	}
	// The directory is missing: nothing to write into.
	if err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("data"), 0o600); err == nil {
		t.Fatal("WriteFile into a missing directory succeeded")
	}
}

// The disk fills up during the write: the old file is still there whole, and no temporary
// file remains to hold the space.
func TestWriteFileFullDiskLeavesOld(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	p := filepath.Join(dir, "key")
	if err := WriteFile(p, []byte("old key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(p, bytes.Repeat([]byte("x"), 1<<20), 0o600)
	if err == nil {
		t.Fatal("a 1 MiB write on a 64 KiB file system succeeded")
	}
	t.Logf("full disk: %v", err)
	if b, err := os.ReadFile(p); err != nil || string(b) != "old key\n" {
		t.Fatalf("after the failed write: %q, %v; want the old file whole", b, err)
	}
	if extra := leftovers(t, dir, "key"); len(extra) > 0 {
		t.Fatalf("temporary files left: %v", extra)
	}
}

func TestCreateFileNeverReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secrets.key")
	if err := CreateFile(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CreateFile(p, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second CreateFile = %v, want fs.ErrExist", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "first" {
		t.Fatalf("content %q, want the first file unchanged", b)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
	if extra := leftovers(t, dir, "secrets.key"); len(extra) > 0 {
		t.Fatalf("temporary files left: %v", extra)
	}
}
