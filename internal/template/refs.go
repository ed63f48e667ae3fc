package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
)

// References. Whatever stands on a layer the store handed out (a sandbox, running, paused or in
// error; a snapshot; a build; a built template) records a reference to it: an empty file
// <root>/.refs/<name>/<version>/<holder> for a built-in template version, or
// <root>/.refs/.layers/<key>/<holder> for a layer of built templates, where root is the store's
// Dir or UserDir. References live on the file system, so that they hold across instances that
// share the directory and across restarts. A version or layer is removed only when it has no
// reference, is not the lower layer of a mount this process sees, and is not the current version
// of its template.
//
// Taking and dropping references, and deciding what to remove, happen under an exclusive flock
// on <root>/.gc.lock, held briefly (removal itself renames the tree aside under the lock and
// deletes it after). Layer collection also needs <UserDir>/.builds.lock, which every build of a
// user template holds shared while it runs (see Building).

const (
	refsDir     = ".refs"
	gcLockFile  = ".gc.lock"
	buildsLock  = ".builds.lock"
	trashPrefix = ".trash-"
	maxHolder   = 200
)

// target is one thing a reference can name: a built-in template version or a user layer.
type target struct {
	root  string // Dir or UserDir: the root holding the lock and the references
	rel   string // "<name>/<version>" or ".layers/<key>"
	path  string // the directory GC removes
	check string // what must exist for the target to be there
}

func (t target) refs() string { return filepath.Join(t.root, refsDir, t.rel) }

// target resolves a path the store handed out (a Template's RootFS or one of its Layers).
func (s *Store) target(p string) (target, error) {
	p = filepath.Clean(p)
	if rel, ok := strings.CutPrefix(p, s.dir+"/"); ok {
		parts := strings.Split(rel, "/")
		if len(parts) == 3 && parts[2] == "rootfs" && nameRE.MatchString(parts[0]) && nameRE.MatchString(parts[1]) {
			vdir := filepath.Join(s.dir, parts[0], parts[1])
			return target{root: s.dir, rel: parts[0] + "/" + parts[1], path: vdir, check: filepath.Join(vdir, metaFile)}, nil
		}
	}
	if rel, ok := strings.CutPrefix(p, s.userRoot+"/"); ok {
		parts := strings.Split(rel, "/")
		if len(parts) == 2 && parts[0] == ".layers" && layerKeyRE.MatchString(parts[1]) {
			return target{root: s.userRoot, rel: rel, path: p, check: p}, nil
		}
	}
	return target{}, errdefs.InvalidArgument(fmt.Sprintf("%s is not a template layer of this store", p))
}

// holderFile is the file name of a holder's reference: the holder, path-escaped, with a leading
// dot escaped too, so that no holder names "." or ".." or a hidden file.
func holderFile(holder string) (string, error) {
	if holder == "" || len(holder) > maxHolder || strings.ContainsRune(holder, 0) {
		return "", errdefs.InvalidArgument(fmt.Sprintf("reference holder %q: 1 to %d bytes, no NUL", holder, maxHolder))
	}
	f := url.PathEscape(holder)
	if strings.HasPrefix(f, ".") {
		f = "%2E" + f[1:]
	}
	return f, nil
}

func holderOf(file string) (string, bool) {
	h, err := url.PathUnescape(file)
	return h, err == nil && h != "" && !strings.HasPrefix(file, ".")
}

// Acquire returns the template called name, building it first if needed (as Ensure), with a
// reference of holder on every layer of it (RootFS and Layers), taken under the lock that
// collection takes, so that nothing in this or another instance removes them until
// Release(holder, ...). If a layer vanished between finding the template and referencing it (an
// instance with other recipes collected it, or the built template was deleted), Acquire looks
// again. Acquire is idempotent per holder.
func (s *Store) Acquire(ctx context.Context, name, holder string) (Template, error) {
	if _, err := holderFile(holder); err != nil {
		return Template{}, err
	}
	var lastErr error
	for range 3 {
		t, err := s.Ensure(ctx, name)
		if err != nil {
			return Template{}, err
		}
		if s.testHookAcquire != nil {
			s.testHookAcquire(t)
		}
		err = s.Hold(ctx, holder, append([]string{t.RootFS}, t.Layers...)...)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return Template{}, err
		}
		lastErr = err
	}
	return Template{}, fmt.Errorf("template %q: %w", name, lastErr)
}

// Hold records a reference of holder on each of paths (a Template's RootFS and Layers, as Ensure,
// Acquire or a sandbox's spec carry them), for a caller that already stands on them: a fork, a
// restore, a snapshot. Every path must exist: a missing one gives an error wrapping
// errdefs.ErrNotFound and holds nothing new; a path that is not a layer of this store gives
// errdefs.ErrInvalidArgument. Holding twice is one reference. References are durable on return.
func (s *Store) Hold(ctx context.Context, holder string, paths ...string) error {
	file, err := holderFile(holder)
	if err != nil {
		return err
	}
	byRoot, err := s.targets(paths)
	if err != nil {
		return err
	}
	var made []string // references this call created, undone on failure
	undo := func() {
		for _, r := range made {
			os.Remove(r)
		}
	}
	for _, root := range []string{s.dir, s.userRoot} {
		ts := byRoot[root]
		if len(ts) == 0 {
			continue
		}
		delete(byRoot, root) // Dir and UserDir may be one
		if err := s.withGCLock(ctx, root, func() error {
			for _, t := range ts {
				//confine:host the template store's own directories and metadata files, not paths inside a template tree
				if _, err := os.Stat(t.check); err != nil {
					if errors.Is(err, fs.ErrNotExist) {
						return errdefs.NotFound(fmt.Sprintf("template layer %s is gone", t.path))
					}
					return err
				}
				ref := filepath.Join(t.refs(), file)
				created, err := createRef(t.root, ref)
				if err != nil {
					return fmt.Errorf("reference %s: %w", t.path, err)
				}
				if created {
					made = append(made, ref)
				}
			}
			return nil
		}); err != nil {
			undo()
			return err
		}
	}
	return nil
}

// Release drops holder's references on paths. Paths it does not hold are not an error. What is
// left without references is removed by the next collection (GC, or the Ensure, Delete or end of
// build that runs one), unless it is still current.
func (s *Store) Release(holder string, paths ...string) error {
	file, err := holderFile(holder)
	if err != nil {
		return err
	}
	byRoot, err := s.targets(paths)
	if err != nil {
		return err
	}
	var errs []error
	for _, root := range []string{s.dir, s.userRoot} {
		ts := byRoot[root]
		if len(ts) == 0 {
			continue
		}
		delete(byRoot, root)
		errs = append(errs, s.withGCLock(context.Background(), root, func() error {
			var errs []error
			for _, t := range ts {
				errs = append(errs, dropRef(t.root, filepath.Join(t.refs(), file)))
			}
			return errors.Join(errs...)
		}))
	}
	return errors.Join(errs...)
}

// Reconcile drops the references of holders that start with holderPrefix (this instance's) for
// which live returns false: what a crash left behind by sandboxes, snapshots and builds that no
// longer exist. Other instances' references are not touched. live is called without any lock
// held. Reconcile also makes each built template of this store hold its root filesystem (see
// Save) and drops such references of built templates that are gone. Call it at start, after
// recovery, before serving; then GC collects what nothing holds any more.
func (s *Store) Reconcile(ctx context.Context, holderPrefix string, live func(holder string) bool) error {
	if holderPrefix == "" {
		return errdefs.InvalidArgument("reconcile: empty holder prefix")
	}
	var errs []error
	roots := []string{s.dir}
	if s.userRoot != s.dir {
		roots = append(roots, s.userRoot)
	}
	tplPrefix := s.templateHolder("")
	for _, root := range roots {
		refs, err := listRefs(filepath.Join(root, refsDir))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var dead []string
		for _, r := range refs {
			switch {
			case strings.HasPrefix(r.holder, holderPrefix) && !live(r.holder):
				dead = append(dead, r.file)
			case strings.HasPrefix(r.holder, tplPrefix):
				if t, err := s.loadUser(strings.TrimPrefix(r.holder, tplPrefix)); err != nil || filepath.Join(root, refsDir, r.rel) != s.mustRefs(t.RootFS) {
					dead = append(dead, r.file)
				}
			}
		}
		if len(dead) == 0 {
			continue
		}
		errs = append(errs, s.withGCLock(ctx, root, func() error {
			var errs []error
			for _, f := range dead {
				s.log.InfoContext(ctx, "dropping stale template reference", "ref", f)
				errs = append(errs, dropRef(root, f))
			}
			return errors.Join(errs...)
		}))
	}
	user, err := s.listUser()
	errs = append(errs, err)
	for _, t := range user {
		switch err := s.Hold(ctx, s.templateHolder(t.Name), t.RootFS); {
		case err == nil, errors.Is(err, errdefs.ErrInvalidArgument): // not one of the store's
		case errors.Is(err, errdefs.ErrNotFound):
			s.log.WarnContext(ctx, "built template stands on a root filesystem that is gone", "template", t.Name, "rootfs", t.RootFS)
		default:
			errs = append(errs, fmt.Errorf("template %s: %w", t.Name, err))
		}
	}
	return errors.Join(errs...)
}

// mustRefs is the references directory of a path, or "" if the path is not one of the store's.
func (s *Store) mustRefs(p string) string {
	t, err := s.target(p)
	if err != nil {
		return ""
	}
	return t.refs()
}

// Holders returns the holders referencing path (a RootFS or layer), sorted.
func (s *Store) Holders(path string) ([]string, error) {
	t, err := s.target(path)
	if err != nil {
		return nil, err
	}
	return holdersOf(t)
}

func holdersOf(t target) ([]string, error) {
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	entries, err := os.ReadDir(t.refs())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if h, ok := holderOf(e.Name()); ok {
			out = append(out, h)
		}
	}
	return out, nil
}

// templateHolder is the holder under which the built template name of this store references its
// root filesystem. It names the UserDir, so that instances with their own UserDir and a shared
// Dir do not share holders.
func (s *Store) templateHolder(name string) string {
	sum := sha256.Sum256([]byte(s.userRoot))
	return "template:" + hex.EncodeToString(sum[:6]) + "/" + name
}

// GC collects everything nothing stands on: old versions of built-in templates (those that are
// not current, have no reference and are not mounted), layers of built templates that no
// template names, nothing references and nothing has mounted (only while no build runs: else
// it is left to the end of the last build), and leftovers of interrupted builds and removals.
func (s *Store) GC(ctx context.Context) error {
	var errs []error
	for name, rec := range s.recipes {
		if err := ctx.Err(); err != nil {
			return err
		}
		version, err := s.version(name, rec)
		if err != nil {
			errs = append(errs, fmt.Errorf("template %q: %w", name, err))
			continue
		}
		nameDir := filepath.Join(s.dir, name)
		//confine:host the template store's own directories and metadata files, not paths inside a template tree
		if _, err := os.Stat(nameDir); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		// Temp dirs of builds are swept only while no build of the name runs anywhere.
		unlock, err := tryLockFile(filepath.Join(s.dir, "."+name+".lock"))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.removeOld(ctx, nameDir, version, unlock != nil)
		if unlock != nil {
			unlock()
		}
	}
	errs = append(errs, s.collectLayers(ctx, nil))
	return errors.Join(errs...)
}

// removeOld deletes versions of a template other than keep that nothing references or has
// mounted, removals a crash interrupted, and (if sweepTmp: the caller holds the template's lock,
// so no build of it runs) leftovers of interrupted builds.
func (s *Store) removeOld(ctx context.Context, nameDir, keep string, sweepTmp bool) {
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	entries, err := os.ReadDir(nameDir)
	if err != nil {
		s.log.WarnContext(ctx, "list template versions", "dir", nameDir, "err", err)
		return
	}
	var trash, old []string
	for _, e := range entries {
		switch n := e.Name(); {
		case n == keep:
		case strings.HasPrefix(n, trashPrefix):
			trash = append(trash, filepath.Join(nameDir, n))
		case strings.HasPrefix(n, ".tmp-"):
			if sweepTmp {
				trash = append(trash, filepath.Join(nameDir, n))
			}
		case nameRE.MatchString(n):
			old = append(old, n)
		}
	}
	if len(old) > 0 {
		err := s.withGCLock(ctx, s.dir, func() error {
			mounts := overlayLowerDirs()
			for _, v := range old {
				t, err := s.target(filepath.Join(nameDir, v, "rootfs"))
				if err != nil {
					continue
				}
				if moved, ok := s.setAside(ctx, t, mounts); ok {
					trash = append(trash, moved)
				}
			}
			return nil
		})
		if err != nil {
			s.log.WarnContext(ctx, "collect template versions", "dir", nameDir, "err", err)
		}
	}
	s.removeTrash(ctx, trash)
}

// setAside renames t's directory to a trash name if nothing references it and no mount uses it,
// returning the new name. The caller holds t.root's GC lock.
func (s *Store) setAside(ctx context.Context, t target, mounts []string) (string, bool) {
	holders, err := holdersOf(t)
	if err != nil {
		s.log.WarnContext(ctx, "read template references", "path", t.path, "err", err)
		return "", false
	}
	if len(holders) > 0 {
		s.log.InfoContext(ctx, "keeping old template layer: referenced", "path", t.path, "holders", len(holders))
		return "", false
	}
	probe := t.path
	if t.check != t.path {
		probe = filepath.Join(t.path, "rootfs")
	}
	if inUse(probe, mounts) {
		s.log.InfoContext(ctx, "keeping old template layer: still mounted", "path", t.path)
		return "", false
	}
	dir, base := filepath.Split(t.path)
	moved := filepath.Join(dir, trashPrefix+base+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Rename(t.path, moved); err != nil {
		s.log.WarnContext(ctx, "remove old template layer", "path", t.path, "err", err)
		return "", false
	}
	if err := durable.Sync(dir); err != nil {
		s.log.WarnContext(ctx, "remove old template layer", "path", t.path, "err", err)
	}
	// An empty references directory goes with it.
	os.Remove(t.refs())
	s.log.InfoContext(ctx, "removed old template layer", "path", t.path)
	return moved, true
}

func (s *Store) removeTrash(ctx context.Context, paths []string) {
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			s.log.WarnContext(ctx, "remove template leftovers", "path", p, "err", err)
		}
	}
}

// targets resolves paths and groups them by root.
func (s *Store) targets(paths []string) (map[string][]target, error) {
	out := map[string][]target{}
	for _, p := range paths {
		t, err := s.target(p)
		if err != nil {
			return nil, err
		}
		out[t.root] = append(out[t.root], t)
	}
	return out, nil
}

// withGCLock runs fn under root's GC lock.
func (s *Store) withGCLock(ctx context.Context, root string, fn func() error) error {
	unlock, err := lockFileCtx(ctx, filepath.Join(root, gcLockFile))
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}

// createRef makes the reference file ref (and its directories) durably; it reports whether it
// was not there before.
func createRef(root, ref string) (bool, error) {
	if err := mkdirDurable(root, filepath.Dir(ref)); err != nil {
		return false, err
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	f, err := os.OpenFile(ref, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := f.Close(); err != nil {
		return true, err
	}
	return true, durable.Sync(filepath.Dir(ref))
}

// mkdirDurable makes dir and its missing parents up to root, syncing each parent that got a new
// entry.
func mkdirDurable(root, dir string) error {
	if dir == root {
		return nil
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := mkdirDurable(root, filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return durable.Sync(filepath.Dir(dir))
}

// dropRef removes a reference file durably, and its directories up to root/.refs once empty.
func dropRef(root, ref string) error {
	err := os.Remove(ref)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	dir := filepath.Dir(ref)
	if err := durable.Sync(dir); err != nil {
		return err
	}
	top := filepath.Join(root, refsDir)
	for d := dir; d != top && strings.HasPrefix(d, top+"/"); d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			break // not empty
		}
	}
	return nil
}

type refEntry struct {
	rel    string // the target's rel
	file   string // the reference file
	holder string
}

// listRefs lists the reference files under a .refs tree: <top>/<a>/<b>/<holder>.
func listRefs(top string) ([]refEntry, error) {
	var out []refEntry
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	as, err := os.ReadDir(top)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, a := range as {
		//confine:host the template store's own directories and metadata files, not paths inside a template tree
		bs, err := os.ReadDir(filepath.Join(top, a.Name()))
		if err != nil {
			continue
		}
		for _, b := range bs {
			rel := a.Name() + "/" + b.Name()
			//confine:host the template store's own directories and metadata files, not paths inside a template tree
			hs, err := os.ReadDir(filepath.Join(top, rel))
			if err != nil {
				continue
			}
			for _, h := range hs {
				if holder, ok := holderOf(h.Name()); ok {
					out = append(out, refEntry{rel: rel, file: filepath.Join(top, rel, h.Name()), holder: holder})
				}
			}
		}
	}
	return out, nil
}

// lockFileCtx takes an exclusive flock on path like lockFile, giving up when ctx ends.
func lockFileCtx(ctx context.Context, path string) (func(), error) {
	return flockCtx(ctx, path, unix.LOCK_EX)
}

// tryLockFile takes an exclusive flock on path if it is free; a nil func means it is taken.
func tryLockFile(path string) (func(), error) {
	f, err := openLock(path)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

func openLock(path string) (*os.File, error) {
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}

// flockCtx takes a flock of kind (LOCK_EX or LOCK_SH) on path, polling so that it can give up
// when ctx ends (a blocking flock cannot be interrupted).
func flockCtx(ctx context.Context, path string, how int) (func(), error) {
	f, err := openLock(path)
	if err != nil {
		return nil, err
	}
	wait := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, context.Cause(ctx))
		case <-time.After(wait):
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}
