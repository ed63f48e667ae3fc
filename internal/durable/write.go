package durable

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces the file at path with data, atomically and durably: data goes to a new
// temporary file in path's directory, which is given mode perm and fsynced, then renamed over
// path, and the directory is fsynced. A reader sees the old file or the new one whole, never a
// part; after a crash the file is one of the two; once WriteFile returns nil the new one is on
// disk. On an error before the rename path is unchanged and no temporary file is left behind.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, true)
}

// CreateFile is WriteFile for a file that must be made once and never replaced (a key two
// starts could race to make): it fails with an error matching fs.ErrExist if path exists, and
// then leaves that file as it is.
func CreateFile(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

// write writes data to a temporary file in path's directory, publishes it as path (renamed
// over it if replace, else linked, which never replaces), and makes the directory durable.
func write(path string, data []byte, perm os.FileMode, replace bool) error {
	dir := filepath.Dir(path)
	//confine:host path is a file spaced itself owns (keys, certificates, metadata), never one inside a sandbox's tree
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	err = tmp.Chmod(perm)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil && replace {
		err = os.Rename(tmp.Name(), path)
	} else if err == nil {
		//confine:host path is a file spaced itself owns (keys, certificates, metadata), never one inside a sandbox's tree
		err = os.Link(tmp.Name(), path)
	}
	if err != nil || !replace {
		os.Remove(tmp.Name()) // what failed, or the link's second name
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := Sync(dir); err != nil {
		return fmt.Errorf("write %s: sync directory: %w", path, err)
	}
	return nil
}
