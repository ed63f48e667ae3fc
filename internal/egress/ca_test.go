package egress

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

// The CA survives a restart unchanged, is written with its modes and without temporary files,
// and a start interrupted between writing the key and the certificate is finished by the next.
func TestCASurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := os.ReadFile(filepath.Join(dir, "egress-ca.key"))
	for name, mode := range map[string]os.FileMode{"egress-ca.key": 0o600, "egress-ca.crt": 0o644} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s: %v %v, want mode %v", name, fi, err, mode)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Fatalf("dir holds %d entries, want the key and the certificate only", len(ents))
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.PEM(), ca.PEM()) || !again.key.Equal(ca.key) {
		t.Fatal("a restart changed the CA")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "egress-ca.key")); !bytes.Equal(b, keyPEM) {
		t.Fatal("a restart rewrote the CA key")
	}
	// A leaf the restarted CA signs verifies under the certificate sandboxes were given.
	leaf, err := again.leaf("example.test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "example.test"}); err != nil {
		t.Fatalf("leaf of the restarted CA: %v", err)
	}

	// Killed after the key, before the certificate: the next start makes a whole new pair.
	half := t.TempDir()
	if err := os.WriteFile(filepath.Join(half, "egress-ca.key"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(half); err != nil {
		t.Fatalf("start after an interrupted first start: %v", err)
	}
}
