package build

import (
	"os"
	"path/filepath"
	"testing"
)

func TestImageUser(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n"), 0o644)
	for in, want := range map[string]string{"": "", "app": "app", "1001": "app", "app:staff": "app", "1001:1001": "app", "0": "root"} {
		if got, err := imageUser(root, in); err != nil || got != want {
			t.Errorf("imageUser(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"nobody", "4242"} {
		if _, err := imageUser(root, bad); err == nil {
			t.Errorf("imageUser(%q) accepted", bad)
		}
	}
	if _, err := imageUser(t.TempDir(), "app"); err == nil {
		t.Error("a user without /etc/passwd accepted")
	}
}
