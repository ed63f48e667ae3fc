package template

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
)

// minimalVersion changes whenever minimalRecipe builds a different tree from the same busybox.
const minimalVersion = 1

// The unprivileged user of every template.
const (
	userUID  = 1000
	userGID  = 1000
	userHome = "/home/user"
)

// minimalRecipe is the smallest useful Linux userland: Debian's statically linked busybox with a
// symlink per applet, users root and user (uid 1000), and the directories a process expects. The
// agent binary is not part of it, only an empty file as its mount point, /.space/space-agent:
// drivers bind-mount the agent there, so templates do not change when the agent is rebuilt.
func minimalRecipe() recipe {
	return recipe{
		version: minimalVersion,
		inputs: func(s *Store) ([]byte, error) {
			if err := checkBusybox(s.busybox); err != nil {
				return nil, err
			}
			d, err := s.digest(s.busybox)
			if err != nil {
				return nil, err
			}
			return []byte("busybox sha256 " + d), nil
		},
		build: buildMinimal,
	}
}

// checkBusybox verifies that path is a statically linked ELF executable: the template has no
// shared libraries, so a dynamically linked busybox could not run in it.
func checkBusybox(path string) error {
	const hint = "install Debian's busybox-static package (apt-get install busybox-static)"
	f, err := elf.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("busybox %s not found; %s: %w", path, hint, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return fmt.Errorf("busybox %s is not a usable ELF executable (%v); %s: %w", path, err, hint, errdefs.ErrFailedPrecondition)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("busybox %s is dynamically linked; %s: %w", path, hint, errdefs.ErrFailedPrecondition)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("busybox %s needs shared libraries %v; %s: %w", path, libs, hint, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func buildMinimal(ctx context.Context, s *Store, rootfs string) error {
	// minimalFiles are the configuration files of the minimal template. resolv.conf is empty: the
	// network layer decides where the sandbox resolves names.
	minimalFiles := []struct {
		path string
		mode os.FileMode
		data string
	}{
		{"etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\n" +
			"user:x:1000:1000:user:/home/user:/bin/sh\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"},
		{"etc/group", 0o644, "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"},
		{"etc/hosts", 0o644, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{"etc/resolv.conf", 0o644, ""},
		// The agent's mount point: drivers bind-mount the agent here. Being in the template,
		// it need not be created in each sandbox's writable layer.
		{".space/space-agent", 0o755, ""},
	}

	// minimalDirs are created with exactly these modes (umask does not apply).
	minimalDirs := []struct {
		path string
		mode os.FileMode
	}{
		{"bin", 0o755}, {"sbin", 0o755}, {"usr", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"etc", 0o755}, {"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"run", 0o755},
		{"tmp", os.ModeSticky | 0o777}, {"var", 0o755}, {"var/tmp", os.ModeSticky | 0o777}, {"root", 0o700},
		{"home", 0o755}, {"home/user", 0o755},
		{".space", 0o755},
	}

	for _, d := range minimalDirs {
		p := filepath.Join(rootfs, d.path)
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		//confine:host a tree this function makes from nothing and a host binary, before any sandbox or image touched it
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	if err := s.chown(filepath.Join(rootfs, "home/user"), userUID, userGID); err != nil {
		return err
	}
	for _, f := range minimalFiles {
		p := filepath.Join(rootfs, f.path)
		//confine:host a tree this function makes from nothing and a host binary, before any sandbox or image touched it
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			return err
		}
		//confine:host a tree this function makes from nothing and a host binary, before any sandbox or image touched it
		if err := os.Chmod(p, f.mode); err != nil {
			return err
		}
	}
	if err := copyFile(s.busybox, filepath.Join(rootfs, "bin/busybox"), 0o755); err != nil {
		return fmt.Errorf("copy busybox: %w", err)
	}
	applets, err := busyboxApplets(ctx, s.busybox)
	if err != nil {
		return err
	}
	for _, a := range applets {
		p := filepath.Join(rootfs, a)
		//confine:host a tree this function makes from nothing and a host binary, before any sandbox or image touched it
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		//confine:host a tree this function makes from nothing and a host binary, before any sandbox or image touched it
		if err := os.Symlink("/bin/busybox", p); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("applet link: %w", err)
		}
	}
	return nil
}

// busyboxApplets returns the install path of every applet, relative to the root ("usr/bin/awk").
// It prefers --list-full; a busybox without it gets every applet in bin/.
func busyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	full := err == nil
	if !full {
		if out, err = exec.CommandContext(ctx, busybox, "--list").Output(); err != nil {
			return nil, fmt.Errorf("list busybox applets: %w", err)
		}
	}
	var applets []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		a := strings.TrimSpace(sc.Text())
		if a == "" {
			continue
		}
		if !full {
			a = "bin/" + a
		}
		a = path.Clean(a)
		if path.IsAbs(a) || a == "." || strings.HasPrefix(a, "../") || a == "bin/busybox" {
			continue
		}
		applets = append(applets, a)
	}
	if len(applets) == 0 {
		return nil, fmt.Errorf("busybox %s lists no applets", busybox)
	}
	return applets, nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	//confine:host a tree this function makes from nothing and a host binary, before any sandbox or image touched it
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	//confine:host a tree this function makes from nothing and a host binary, before any sandbox or image touched it
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// chown sets ownership, tolerating EPERM when not running as root (unit tests): such a template
// is fine for looking at, and spaced always runs as root.
func (s *Store) chown(p string, uid, gid int) error {
	//confine:host a tree this function makes from nothing and a host binary, before any sandbox or image touched it
	err := os.Lchown(p, uid, gid)
	if err != nil && errors.Is(err, fs.ErrPermission) && os.Geteuid() != 0 {
		s.log.Debug("not root: leaving ownership", "path", p, "uid", uid)
		return nil
	}
	return err
}
