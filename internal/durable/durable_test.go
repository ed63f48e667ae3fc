package durable

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSyncTree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(dir, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "a/b/f"), []byte("x"), 0o644)
	os.Symlink("f", filepath.Join(dir, "a/b/link"))
	if err := SyncTree(dir); err != nil {
		t.Fatal(err)
	}
	if err := SyncFS(dir); err != nil {
		t.Fatal(err)
	}
	if err := SyncTree(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("SyncTree of a missing directory succeeded")
	}
	if err := Sync(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("Sync of a missing file succeeded")
	}
}
