// Package sandbox stands for a package that handles sandbox trees.
package sandbox

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// readLayerFile reintroduces the class: a path inside a writable layer, opened by name.
func readLayerFile(layer string) ([]byte, error) {
	f, err := os.Open(filepath.Join(layer, "etc/ssl/certs/ca-certificates.crt")) // want `os.Open resolves a path by name`
	if err != nil {
		return nil, err
	}
	defer f.Close()
	_ = filepath.WalkDir(layer, nil) // want `filepath.WalkDir resolves a path by name`
	var st unix.Stat_t
	_ = unix.Lstat(filepath.Join(layer, "x"), &st) // want `unix.Lstat resolves a path by name`
	return os.ReadFile(filepath.Join(layer, "x"))  // want `os.ReadFile resolves a path by name`
}

// stateFile is the host's own: marked, so not reported.
func stateFile(home string) ([]byte, error) {
	//confine:host spaced's own state file
	return os.ReadFile(filepath.Join(home, "state.json"))
}
