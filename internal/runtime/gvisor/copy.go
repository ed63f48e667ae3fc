package gvisor

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/space-sandbox/space/internal/confine"
)

// copyTree copies the contents of directory src, a writable layer the sandbox wrote, into the
// existing directory dst through confine: whiteouts, ownership, times, host-safe extended
// attributes (trusted.overlay.opaque, user.*) and hard links are kept; links are copied, never
// followed; set-id bits, devices, fifos and sockets never reach the host copy.
func copyTree(src, dst string) error {
	s, err := confine.Open(src)
	if err != nil {
		return err
	}
	defer s.Close()
	d, err := confine.Open(dst)
	if err != nil {
		return err
	}
	defer d.Close()
	if _, err := confine.CopyTree(s, d); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

// copyFile copies the regular file name of directory dir to a new file dst with mode perm.
// dir may be a checkpoint directory: name is opened through confine, never through a link.
func copyFile(dir, name, dst string, perm os.FileMode) error {
	root, err := confine.Open(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	in, _, err := root.Open(name)
	if err != nil {
		return err
	}
	defer in.Close()
	//confine:host dst is a new file of the driver's own directory
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", filepath.Join(dir, name), err)
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
