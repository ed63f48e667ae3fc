package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/space-sandbox/space/pkg/client"
)

// remotePath is the sandbox side of a copy, written ID:/abs/path.
type remotePath struct {
	id, path string
}

// parseRemote recognises ID:/path. The ID holds no '/' (so ./a:/b stays local) and the path is
// absolute.
func parseRemote(s string) (remotePath, bool) {
	id, p, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.ContainsAny(id, `/\`) || !strings.HasPrefix(p, "/") {
		return remotePath{}, false
	}
	return remotePath{id: id, path: p}, true
}

func (a *app) cmdCopy(args []string) error {
	fs := a.newFlagSet("cp", "(LOCAL|-) ID:/path | ID:/path (LOCAL|-)")
	pos, rest, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	pos = append(pos, rest...)
	if len(pos) != 2 {
		return usagef("cp needs a source and a destination")
	}
	srcRemote, srcIsRemote := parseRemote(pos[0])
	dstRemote, dstIsRemote := parseRemote(pos[1])
	switch {
	case srcIsRemote == dstIsRemote:
		return usagef("cp copies between this machine and a sandbox: exactly one side must be ID:/path")
	case dstIsRemote:
		return a.upload(pos[0], dstRemote)
	default:
		return a.download(srcRemote, pos[1])
	}
}

func (a *app) upload(local string, dst remotePath) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	var (
		r    io.Reader
		opts client.UploadOptions
	)
	if local == "-" {
		if strings.HasSuffix(dst.path, "/") {
			return usagef("cp from standard input needs a file name, not the directory %s", dst.path)
		}
		r = a.stdin
	} else {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return usagef("cp copies files; %s is a directory", local)
		}
		opts.Mode = client.FileMode(fi.Mode().Perm())
		r = f
		if strings.HasSuffix(dst.path, "/") {
			dst.path += filepath.Base(local)
		}
	}
	res, err := c.Upload(a.ctx, dst.id, dst.path, r, &opts)
	if err != nil {
		return err
	}
	if a.global.json {
		return a.printJSON(res)
	}
	return nil
}

func (a *app) download(src remotePath, local string) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	rc, err := c.Download(a.ctx, src.id, src.path)
	if err != nil {
		return err
	}
	defer rc.Close()
	if local == "-" {
		if _, err := io.Copy(a.stdout, rc); err != nil {
			return fmt.Errorf("copy %s:%s: %w", src.id, src.path, err)
		}
		return nil
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(src.path))
	}
	n, err := writeFileAtomic(local, rc)
	if err != nil {
		return fmt.Errorf("copy %s:%s to %s: %w", src.id, src.path, local, err)
	}
	if a.global.json {
		return a.printJSON(struct {
			Path string `json:"path"`
			Size int64  `json:"size"`
		}{local, n})
	}
	return nil
}

// writeFileAtomic streams r into a temporary file next to name and renames it over name once
// complete, so that a failed copy leaves no partial file.
func writeFileAtomic(name string, r io.Reader) (int64, error) {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".space-*")
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		return 0, errors.Join(err, os.Remove(f.Name()))
	}
	return n, nil
}
