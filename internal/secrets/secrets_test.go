package secrets

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestSealOpen(t *testing.T) {
	dir := t.TempDir()
	b, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "secrets.key")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v", fi.Mode().Perm())
	}
	sealed := b.Seal([]byte("ghp_topsecret"), "t1/github")
	if bytes.Contains(sealed, []byte("topsecret")) {
		t.Fatal("sealed value holds the plaintext")
	}
	b2, err := LoadOrCreate(dir) // the same key again
	if err != nil {
		t.Fatal(err)
	}
	if v, err := b2.Open(sealed, "t1/github"); err != nil || string(v) != "ghp_topsecret" {
		t.Fatalf("open: %q %v", v, err)
	}
	if _, err := b2.Open(sealed, "t2/github"); err == nil {
		t.Fatal("a value opened for another secret")
	}
	sealed[len(sealed)-1] ^= 1
	if _, err := b2.Open(sealed, "t1/github"); err == nil {
		t.Fatal("a tampered value opened")
	}
	os.Chmod(filepath.Join(dir, "secrets.key"), 0o644)
	if _, err := LoadOrCreate(dir); err == nil {
		t.Fatal("a world-readable key accepted")
	}
}
