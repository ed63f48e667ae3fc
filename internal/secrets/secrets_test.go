package secrets

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
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

// Starts racing to make the key agree on one (it is created once, never replaced), and it
// survives a restart: what one sealed, every later start opens.
func TestKeyMadeOnce(t *testing.T) {
	dir := t.TempDir()
	boxes := make([]*Box, 8)
	errs := make([]error, len(boxes))
	var wg sync.WaitGroup
	for i := range boxes {
		wg.Go(func() { boxes[i], errs[i] = LoadOrCreate(dir) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
	}
	restarted, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range boxes {
		if v, err := restarted.Open(b.Seal([]byte("v"), "t/s"), "t/s"); err != nil || string(v) != "v" {
			t.Fatalf("start %d sealed under another key than the one on disk: %v", i, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("dir holds %d entries, want secrets.key only", len(ents))
	}
}
