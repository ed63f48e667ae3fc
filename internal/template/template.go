// Package template owns the template root filesystems of one spaced instance: read-only directory
// trees that runtime drivers use as the lower layer of every sandbox. Each template is built by a
// recipe into <Dir>/<name>/<version>/rootfs, where version is a hash of everything the recipe
// reads, so a template is rebuilt only when its inputs change. Builds happen in a temporary
// directory that is renamed into place, so a half-built template never looks done. Whatever
// stands on a version or layer (sandboxes, snapshots, builds, built templates) holds a reference
// to it on the file system (refs.go), so that no instance sharing the directory removes it
// before it is released. Imported by the sandbox lifecycle and cmd/spaced.
package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/confine"
	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
)

// Config configures a Store.
type Config struct {
	Dir     string // where built-in templates live (may be shared by instances), normally SPACE_HOME/templates
	UserDir string // where built templates and their layers live; default Dir
	Busybox string // host path of a statically linked busybox; default /bin/busybox
	Logger  *slog.Logger
}

// Template is one built template.
type Template struct {
	Name      string
	Version   string // recipe hash; changes whenever the template is rebuilt from other inputs
	RootFS    string // absolute path of the root filesystem directory; read-only for everyone
	SizeBytes int64  // apparent size of the files in RootFS
	CreatedAt time.Time
	Parent    string // template this one is layered on; empty for base templates

	// Built templates (see user.go): read-only layers over RootFS, bottom to top, and the
	// defaults their image or build steps set for every command.
	Layers     []string          `json:",omitempty"`
	Env        map[string]string `json:",omitempty"`
	WorkingDir string            `json:",omitempty"`
	User       string            `json:",omitempty"`
	// Start, if set, is a service every sandbox of the template runs from its start (the code
	// interpreter's server): the sandbox is ready once it answers.
	Start *Start `json:",omitempty"`
}

// Start is a service a template's sandboxes run: the command, who runs it, and the HTTP check
// that says it is ready (a GET of ReadyPath on ReadyPort inside the sandbox answering 200).
type Start struct {
	Command    []string          `json:"command"`
	User       string            `json:"user,omitempty"`
	WorkingDir string            `json:"workingDir,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	ReadyPort  int               `json:"readyPort"`
	ReadyPath  string            `json:"readyPath"`
}

// Store builds and finds templates. It is safe for concurrent use; concurrent Ensure calls for
// one template share a single build, also across processes that share Dir (a lock file).
type Store struct {
	dir      string
	userRoot string // holds .user (built templates) and .layers
	busybox  string
	log      *slog.Logger
	recipes  map[string]recipe

	// buildMu is held shared by builds of user templates in this process and exclusively by
	// layer collection, beside the cross-instance flock on <UserDir>/.builds.lock (a flock
	// cannot tell this process's goroutines apart if they share a file; they do not, but this
	// keeps the rule visible). layerGCPending says a collection was put off by running builds.
	buildMu        sync.RWMutex
	layerGCPending atomic.Bool

	testHookAcquire func(Template) // tests: runs in Acquire between finding and holding

	mu       sync.Mutex
	inflight map[string]*ensureCall
	building map[*tracker]struct{}
	digests  map[fileKey]string // content hashes of recipe inputs, keyed by identity and mtime
}

// ensureCall is one build (or lookup) of a built-in template shared by the Ensure calls that
// wait for it; it is cancelled when the last of them gives up.
type ensureCall struct {
	done    chan struct{}
	cancel  context.CancelCauseFunc
	waiters int // guarded by Store.mu
	tmpl    Template
	err     error
}

// recipe builds one template. inputs returns the bytes that identify everything the build reads
// besides the recipe itself; the template's version is a hash of name, recipe version and inputs.
type recipe struct {
	version int
	inputs  func(s *Store) ([]byte, error)
	build   func(ctx context.Context, s *Store, rootfs string) error

	// A layered recipe builds one layer over the current version of the built-in template
	// parent (whose version is part of this one's), and gives its templates these defaults.
	parent     string
	env        map[string]string
	workingDir string
	user       string
	start      *Start
}

// metaFile is written next to rootfs inside each version directory before it is renamed into
// place.
const metaFile = "template.json"

type meta struct {
	Name      string    `json:"name"`
	Version   string    `json:"version"`
	SizeBytes int64     `json:"sizeBytes"`
	CreatedAt time.Time `json:"createdAt"`
	Parent    string    `json:"parent,omitempty"`
	// A layered template: the parent's version it stands on, and its defaults.
	ParentVersion string            `json:"parentVersion,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	WorkingDir    string            `json:"workingDir,omitempty"`
	User          string            `json:"user,omitempty"`
	Start         *Start            `json:"start,omitempty"`
}

// New returns a Store rooted at cfg.Dir, creating the directory if needed.
func New(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errdefs.InvalidArgument("template: Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if cfg.Busybox == "" {
		cfg.Busybox = "/bin/busybox"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// Root's alone: template trees hold what images and build steps wrote.
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("template: create %s: %w", dir, err)
	}
	userRoot := dir
	if cfg.UserDir != "" {
		if userRoot, err = filepath.Abs(cfg.UserDir); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
		//confine:host the template store's own directories and metadata files, not paths inside a template tree
		if err := os.MkdirAll(userRoot, 0o700); err != nil {
			return nil, fmt.Errorf("template: create %s: %w", userRoot, err)
		}
	}
	return &Store{
		dir:      dir,
		userRoot: userRoot,
		busybox:  cfg.Busybox,
		log:      cfg.Logger,
		recipes:  map[string]recipe{"minimal": minimalRecipe(), "base": baseRecipe("/etc/apt"), codeInterpreter: codeInterpreterRecipe()},
		inflight: map[string]*ensureCall{},
		building: map[*tracker]struct{}{},
		digests:  map[fileKey]string{},
	}, nil
}

// Ensure returns the template called name, building it first if it is missing or its inputs have
// changed since it was built. Afterwards, older versions of the template that nothing references
// (see Acquire) and no mount uses are removed. Unknown names give an error wrapping
// errdefs.ErrNotFound.
//
// Concurrent calls for one built-in template share one build, also across processes that share
// Dir (a lock file). The build stops, and leaves nothing behind, when every caller waiting for it
// has given up (its context ended): within about a second, child processes included. A
// template returned by Ensure is not referenced: a caller that stands on it uses Acquire.
func (s *Store) Ensure(ctx context.Context, name string) (Template, error) {
	rec, ok := s.recipes[name]
	if !ok {
		return s.loadUser(name)
	}
	if err := ctx.Err(); err != nil {
		return Template{}, fmt.Errorf("template %q: %w", name, context.Cause(ctx))
	}
	s.mu.Lock()
	call, running := s.inflight[name]
	if !running {
		bctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
		call = &ensureCall{done: make(chan struct{}), cancel: cancel}
		s.inflight[name] = call
		go func() {
			tmpl, err := s.ensure(bctx, name, rec)
			s.mu.Lock()
			call.tmpl, call.err = tmpl, err
			if s.inflight[name] == call {
				delete(s.inflight, name)
			}
			s.mu.Unlock()
			cancel(nil)
			close(call.done)
		}()
	}
	call.waiters++
	s.mu.Unlock()
	select {
	case <-call.done:
		return call.tmpl, call.err
	case <-ctx.Done():
		s.mu.Lock()
		if call.waiters--; call.waiters == 0 {
			// The last one out stops the build; a later Ensure starts afresh.
			if s.inflight[name] == call {
				delete(s.inflight, name)
			}
			call.cancel(context.Cause(ctx))
		}
		s.mu.Unlock()
		return Template{}, fmt.Errorf("template %q: %w", name, context.Cause(ctx))
	}
}

// ensure does the work of Ensure for one caller at a time per name in this process; the lock
// file extends that to other processes.
func (s *Store) ensure(ctx context.Context, name string, rec recipe) (Template, error) {
	if rec.parent != "" {
		// The layer goes on the parent's current version: that is built first.
		if _, err := s.Ensure(ctx, rec.parent); err != nil {
			return Template{}, fmt.Errorf("template %q: %w", name, err)
		}
	}
	version, err := s.version(name, rec)
	if err != nil {
		return Template{}, fmt.Errorf("template %q: %w", name, err)
	}
	nameDir := filepath.Join(s.dir, name)
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if err := os.MkdirAll(nameDir, 0o755); err != nil {
		return Template{}, fmt.Errorf("template %q: %w", name, err)
	}
	unlock, err := lockFileCtx(ctx, filepath.Join(s.dir, "."+name+".lock"))
	if err != nil {
		return Template{}, fmt.Errorf("template %q: %w", name, err)
	}
	defer unlock()

	tmpl, err := s.load(name, version)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		if tmpl, err = s.build(ctx, name, version, rec); err != nil {
			return Template{}, fmt.Errorf("template %q: %w", name, err)
		}
	default:
		return Template{}, fmt.Errorf("template %q: %w", name, err)
	}
	s.removeOld(ctx, nameDir, version, true)
	return tmpl, nil
}

// trackerKey carries a build's tracker to its recipe, for progress.
type trackerKey struct{}

// trackerFrom returns the tracker of the build ctx belongs to, or a detached one.
func trackerFrom(ctx context.Context, s *Store) *tracker {
	if t, ok := ctx.Value(trackerKey{}).(*tracker); ok {
		return t
	}
	return &tracker{s: s}
}

// version hashes the recipe's identity and inputs into a short directory name.
func (s *Store) version(name string, rec recipe) (string, error) {
	in, err := rec.inputs(s)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "space template %s recipe v%d\x00", name, rec.version)
	if rec.parent != "" {
		prec, ok := s.recipes[rec.parent]
		if !ok || prec.parent != "" {
			return "", fmt.Errorf("template %s: parent %q is not a built-in template of one layer", name, rec.parent)
		}
		pv, err := s.version(rec.parent, prec)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "on %s %s\x00", rec.parent, pv)
	}
	h.Write(in)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// load reads a complete version directory; fs.ErrNotExist means it was never built.
func (s *Store) load(name, version string) (Template, error) {
	vdir := filepath.Join(s.dir, name, version)
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	b, err := os.ReadFile(filepath.Join(vdir, metaFile))
	if err != nil {
		return Template{}, err
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Template{}, fmt.Errorf("read %s: %w", filepath.Join(vdir, metaFile), err)
	}
	t := Template{
		Name:      m.Name,
		Version:   m.Version,
		RootFS:    filepath.Join(vdir, "rootfs"),
		SizeBytes: m.SizeBytes,
		CreatedAt: m.CreatedAt,
		Parent:    m.Parent,
		Env:       m.Env, WorkingDir: m.WorkingDir, User: m.User, Start: m.Start,
	}
	if m.ParentVersion != "" {
		// A layered version: its tree is a layer over the parent's version.
		if !nameRE.MatchString(m.Parent) || !nameRE.MatchString(m.ParentVersion) {
			return Template{}, fmt.Errorf("read %s: parent %q version %q", filepath.Join(vdir, metaFile), m.Parent, m.ParentVersion)
		}
		t.Layers = []string{t.RootFS}
		t.RootFS = filepath.Join(s.dir, m.Parent, m.ParentVersion, "rootfs")
	}
	return t, nil
}

// build runs the recipe in a temporary directory and renames it into place. The rename is the
// commit point: before it nothing under the version's name exists.
func (s *Store) build(ctx context.Context, name, version string, rec recipe) (Template, error) {
	start := time.Now()
	s.log.InfoContext(ctx, "building template", "template", name, "version", version)
	t := s.track(name, version)
	defer t.untrack()
	ctx = context.WithValue(ctx, trackerKey{}, t)
	nameDir := filepath.Join(s.dir, name)
	tmp, err := os.MkdirTemp(nameDir, ".tmp-"+version+"-")
	if err != nil {
		return Template{}, err
	}
	committed := false
	defer func() {
		if !committed {
			os.RemoveAll(tmp)
		}
	}()
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Template{}, err
	}
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Template{}, err
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if err := os.Chmod(rootfs, 0o755); err != nil {
		return Template{}, err
	}
	if err := rec.build(ctx, s, rootfs); err != nil {
		return Template{}, err
	}
	size, err := treeSize(rootfs)
	if err != nil {
		return Template{}, err
	}
	m := meta{Name: name, Version: version, SizeBytes: size, CreatedAt: time.Now().UTC()}
	if rec.parent != "" {
		prec := s.recipes[rec.parent]
		pv, err := s.version(rec.parent, prec)
		if err != nil {
			return Template{}, err
		}
		m.Parent, m.ParentVersion = rec.parent, pv
		m.Env, m.WorkingDir, m.User, m.Start = rec.env, rec.workingDir, rec.user, rec.start
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Template{}, err
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if err := os.WriteFile(filepath.Join(tmp, metaFile), append(b, '\n'), 0o644); err != nil {
		return Template{}, err
	}
	// Flush the whole tree before the rename makes it visible, so that a crash never leaves a
	// complete-looking version with empty files.
	if err := durable.SyncFS(tmp); err != nil {
		return Template{}, err
	}
	final := filepath.Join(nameDir, version)
	// A directory under the final name without metadata was not made by a build of ours
	// (renames are atomic); it cannot be trusted.
	if err := os.RemoveAll(final); err != nil {
		return Template{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return Template{}, err
	}
	committed = true
	if err := durable.Sync(nameDir); err != nil {
		return Template{}, err
	}
	s.log.InfoContext(ctx, "built template", "template", name, "version", version,
		"size_bytes", size, "duration", time.Since(start).Round(time.Millisecond))
	return s.load(name, version)
}

// List returns the newest built version of every template in the store, sorted by name. It
// builds nothing.
func (s *Store) List(ctx context.Context) ([]Template, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Template
	for _, n := range names {
		if !n.IsDir() || strings.HasPrefix(n.Name(), ".") {
			continue
		}
		//confine:host the template store's own directories and metadata files, not paths inside a template tree
		versions, err := os.ReadDir(filepath.Join(s.dir, n.Name()))
		if err != nil {
			return nil, fmt.Errorf("list templates: %w", err)
		}
		var newest *Template
		for _, v := range versions {
			if !v.IsDir() || strings.HasPrefix(v.Name(), ".") {
				continue
			}
			t, err := s.load(n.Name(), v.Name())
			if err != nil {
				s.log.Warn("skipping unreadable template version", "template", n.Name(), "version", v.Name(), "err", err)
				continue
			}
			if newest == nil || t.CreatedAt.After(newest.CreatedAt) {
				newest = &t
			}
		}
		if newest != nil {
			out = append(out, *newest)
		}
	}
	user, err := s.listUser()
	if err != nil {
		return nil, err
	}
	out = append(out, user...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// fileKey identifies one version of a host file cheaply, to avoid rehashing it on every Ensure.
type fileKey struct {
	path     string
	dev, ino uint64
	size     int64
	mtime    int64
	ctime    int64
}

// digest returns the hex SHA-256 of a file's content, cached while the file is unchanged.
func (s *Store) digest(path string) (string, error) {
	var st unix.Stat_t
	//confine:host a host file (the agent, busybox) the template store hashes
	if err := unix.Stat(path, &st); err != nil {
		return "", &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	key := fileKey{path: path, dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
	s.mu.Lock()
	d, ok := s.digests[key]
	s.mu.Unlock()
	if ok {
		return d, nil
	}
	//confine:host a host file (the agent, busybox) the template store hashes
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := f.WriteTo(h); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	d = hex.EncodeToString(h.Sum(nil))
	s.mu.Lock()
	s.digests[key] = d
	s.mu.Unlock()
	return d, nil
}

// treeSize is the total length of the regular files of a template tree (walked through
// confine: template layers are what images and build steps wrote).
func treeSize(root string) (int64, error) {
	r, err := confine.Open(root)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	return r.Size("")
}

// overlayLowerDirs returns the lowerdir option of every overlay mount this process can see.
func overlayLowerDirs() []string {
	//confine:host the host's /proc
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		_, rest, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f := strings.Fields(rest) // fstype source superoptions
		if len(f) < 3 || f[0] != "overlay" {
			continue
		}
		for opt := range strings.SplitSeq(f[2], ",") {
			if v, ok := strings.CutPrefix(opt, "lowerdir="); ok {
				out = append(out, v)
			}
		}
	}
	return out
}

// inUse reports whether dir is one of the colon-separated layers of any lowerdir option.
func inUse(dir string, lowerdirs []string) bool {
	for _, l := range lowerdirs {
		for layer := range strings.SplitSeq(l, ":") {
			if unescapeMount(layer) == dir {
				return true
			}
		}
	}
	return false
}

// unescapeMount undoes the octal escapes (\040 etc.) of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
