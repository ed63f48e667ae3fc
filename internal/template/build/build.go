// Package build builds templates from recipes: a parent template or an image, then run, copy,
// env and workdir steps, each run or copy step in a build sandbox whose writable layer becomes a
// layer of the template (internal/template keeps them). It drives the sandbox lifecycle only
// through Lifecycle, which *sandbox.Manager implements. The API and cmd/spaced import it.
package build

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/confine"
	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/image"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/template"
)

// Lifecycle is what builds need of the sandbox lifecycle; *sandbox.Manager implements it. Its
// methods are safe to call concurrently.
type Lifecycle interface {
	// Template resolves a template by name, building a built-in one if needed.
	Template(ctx context.Context, name string) (sandbox.Template, error)
	// CanBuild reports nil if build sandboxes can hand over their writable layer.
	CanBuild() error
	// StartBuild starts a build sandbox (hidden from tenants) on tpl and returns once its agent
	// answers. The caller must Remove it, whatever happens; a crash of spaced leaves it to
	// recovery.
	StartBuild(ctx context.Context, tpl sandbox.Template) (*sandbox.BuildSandbox, error)
	// LayersInUse lists the layers every sandbox and snapshot stands on.
	LayersInUse() []string
}

// Config holds a Builder's dependencies.
type Config struct {
	Lifecycle Lifecycle
	// Store keeps the templates; without it, listing, building and deleting templates fail.
	Store  *template.Store
	Logger *slog.Logger
	// Crash, for the crash-point tests only, kills spaced at one named step (nil: never).
	Crash *crashpoint.Hook
}

// Builder lists, builds and deletes templates.
type Builder struct {
	lc    Lifecycle
	ts    *template.Store
	log   *slog.Logger
	crash *crashpoint.Hook
}

// New returns a Builder.
func New(cfg Config) *Builder {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Builder{lc: cfg.Lifecycle, ts: cfg.Store, log: cfg.Logger, crash: cfg.Crash}
}

// Request builds a template from a parent template (or, later, an image) and steps.
type Request struct {
	Name  string `json:"name"`
	From  From   `json:"from"`
	Steps []Step `json:"steps"`
}

// From names the parent: exactly one of Template and Image.
type From struct {
	Template string `json:"template,omitempty"`
	Image    string `json:"image,omitempty"`
}

// Step is one step; exactly one field is set.
type Step struct {
	Run     string            `json:"run,omitempty"`
	Copy    *CopyStep         `json:"copy,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
}

// CopyStep writes one file into the template: Content (text) or ContentB64 (bytes).
type CopyStep struct {
	Path       string `json:"path"`
	Content    string `json:"content,omitempty"`
	ContentB64 string `json:"content_b64,omitempty"`
	Mode       uint32 `json:"mode,omitempty"`
}

// maxBuildSteps bounds a recipe.
const maxBuildSteps = 100

func (st Step) validate(i int) error {
	n := 0
	if st.Run != "" {
		n++
	}
	if st.Copy != nil {
		n++
		if !path.IsAbs(st.Copy.Path) || strings.ContainsRune(st.Copy.Path, 0) {
			return errdefs.InvalidArgument(fmt.Sprintf("steps[%d].copy.path: want an absolute path", i))
		}
		if st.Copy.Content != "" && st.Copy.ContentB64 != "" {
			return errdefs.InvalidArgument(fmt.Sprintf("steps[%d].copy: content or content_b64, not both", i))
		}
		if _, err := base64.StdEncoding.DecodeString(st.Copy.ContentB64); err != nil {
			return errdefs.InvalidArgument(fmt.Sprintf("steps[%d].copy.content_b64: %v", i, err))
		}
		if st.Copy.Mode > 0o7777 {
			return errdefs.InvalidArgument(fmt.Sprintf("steps[%d].copy.mode: want permission bits", i))
		}
	}
	if st.Env != nil {
		n++
		if err := sandbox.ValidateEnv(fmt.Sprintf("steps[%d].env", i), st.Env); err != nil {
			return err
		}
	}
	if st.Workdir != "" {
		n++
		if !path.IsAbs(st.Workdir) {
			return errdefs.InvalidArgument(fmt.Sprintf("steps[%d].workdir: want an absolute path", i))
		}
	}
	if n != 1 {
		return errdefs.InvalidArgument(fmt.Sprintf("steps[%d]: want exactly one of run, copy, env, workdir", i))
	}
	return nil
}

// TemplateInfo is a template as the API lists it.
type TemplateInfo struct {
	Name      string
	SizeBytes int64
	CreatedAt time.Time
	Parent    string
}

func (m *Builder) templateStore() (*template.Store, error) {
	if m.ts == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "this server has no template store")
	}
	return m.ts, nil
}

// List lists built-in and built templates.
// Builds is what template builds are under way on this server and how far along each is
// (nil without a template store).
func (m *Builder) Builds() []template.Progress {
	if m.ts == nil {
		return nil
	}
	return m.ts.Builds()
}

func (m *Builder) List(ctx context.Context) ([]TemplateInfo, error) {
	ts, err := m.templateStore()
	if err != nil {
		return nil, err
	}
	list, err := ts.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]TemplateInfo, 0, len(list))
	for _, t := range list {
		out = append(out, TemplateInfo{Name: t.Name, SizeBytes: t.SizeBytes, CreatedAt: t.CreatedAt, Parent: t.Parent})
	}
	return out, nil
}

// Delete removes a built template (and layers nothing uses any more).
func (m *Builder) Delete(ctx context.Context, name string) error {
	ts, err := m.templateStore()
	if err != nil {
		return err
	}
	return ts.Delete(ctx, name, m.lc.LayersInUse)
}

// Build builds req into a new template, reporting progress through logf. Each run or
// copy step executes in a fresh build sandbox on the layers so far; its writable layer becomes a
// layer of the template, stored under a key of (parent, steps so far), so that a rebuild of an
// unchanged recipe (or one that shares a prefix) reuses those layers without running anything.
func (m *Builder) Build(ctx context.Context, req Request, logf func(string)) (TemplateInfo, error) {
	ts, err := m.templateStore()
	if err != nil {
		return TemplateInfo{}, err
	}
	defer ts.Building()() // no layer cleanup while layers are made and found
	if !sandbox.ValidTemplateName(req.Name) {
		return TemplateInfo{}, errdefs.InvalidArgument(fmt.Sprintf("name %q: lowercase letters, digits, '.', '_' and '-', up to 63", req.Name))
	}
	if len(req.Steps) > maxBuildSteps {
		return TemplateInfo{}, errdefs.InvalidArgument(fmt.Sprintf("steps: at most %d", maxBuildSteps))
	}
	for i, st := range req.Steps {
		if err := st.validate(i); err != nil {
			return TemplateInfo{}, err
		}
	}
	var parent string
	var cur sandbox.Template
	switch {
	case req.From.Template != "" && req.From.Image == "":
		parent = req.From.Template
		if parent == req.Name {
			return TemplateInfo{}, errdefs.InvalidArgument("a template cannot be built from itself")
		}
		if cur, err = m.lc.Template(ctx, parent); err != nil {
			return TemplateInfo{}, fmt.Errorf("from.template: %w", err)
		}
	case req.From.Image != "" && req.From.Template == "":
		parent = req.From.Image
		if cur, err = m.imageTemplate(ctx, ts, req.From.Image, logf); err != nil {
			return TemplateInfo{}, err
		}
	default:
		return TemplateInfo{}, errdefs.InvalidArgument("from: want exactly one of template and image")
	}
	cur.Layers = append([]string(nil), cur.Layers...)
	key := hashOf("space-template-v1", cur)
	if err := m.lc.CanBuild(); err != nil {
		return TemplateInfo{}, err
	}
	logf(fmt.Sprintf("building %s from %s: %d steps", req.Name, parent, len(req.Steps)))
	for i, st := range req.Steps {
		key = hashOf(key, st)
		switch {
		case st.Env != nil:
			if cur.Env == nil {
				cur.Env = map[string]string{}
			}
			for k, v := range st.Env {
				cur.Env[k] = v
			}
			logf(fmt.Sprintf("step %d/%d: env", i+1, len(req.Steps)))
			continue
		case st.Workdir != "":
			cur.WorkingDir = st.Workdir
			logf(fmt.Sprintf("step %d/%d: workdir %s", i+1, len(req.Steps), st.Workdir))
			continue
		}
		layer, exists, err := ts.LayerPath(key[:32])
		if err != nil {
			return TemplateInfo{}, err
		}
		if exists {
			logf(fmt.Sprintf("step %d/%d: cached", i+1, len(req.Steps)))
			cur.Layers = append(cur.Layers, layer)
			continue
		}
		logf(fmt.Sprintf("step %d/%d: %s", i+1, len(req.Steps), describe(st)))
		if err := m.runStep(ctx, cur, st, layer, logf); err != nil {
			return TemplateInfo{}, fmt.Errorf("step %d: %w", i+1, err)
		}
		cur.Layers = append(cur.Layers, layer)
	}
	saved, err := ts.Save(ctx, template.Template{Name: req.Name, RootFS: cur.RootFS, Layers: cur.Layers,
		Env: cur.Env, WorkingDir: cur.WorkingDir, User: cur.User, Start: storeStart(cur.Start), Parent: parent})
	if err != nil {
		return TemplateInfo{}, err
	}
	logf(fmt.Sprintf("built %s (%d layers, %d bytes)", req.Name, len(saved.Layers)+1, saved.SizeBytes))
	return TemplateInfo{Name: saved.Name, SizeBytes: saved.SizeBytes, CreatedAt: saved.CreatedAt, Parent: saved.Parent}, nil
}

func describe(st Step) string {
	if st.Copy != nil {
		return "copy " + st.Copy.Path
	}
	r := st.Run
	if len(r) > 80 {
		r = r[:77] + "..."
	}
	return "run " + r
}

func hashOf(prev string, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain data
	}
	sum := sha256.Sum256(append([]byte(prev+"\n"), b...))
	return hex.EncodeToString(sum[:])
}

// runStep runs one step in a build sandbox made from tpl and stores its writable layer at layer.
// The build sandbox is hidden from tenants and removed whatever happens (after a crash of
// spaced, by recovery).
func (m *Builder) runStep(ctx context.Context, tpl sandbox.Template, st Step, layer string, logf func(string)) (err error) {
	b, err := m.lc.StartBuild(ctx, tpl)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := b.Remove(cctx); derr != nil {
			m.log.Error("remove build sandbox", "id", b.ID(), "err", derr)
		}
	}()
	m.crash.At(crashpoint.BuildStarted)
	switch {
	case st.Run != "":
		s, err := b.Agent().Start(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", st.Run}, Env: tpl.Env, Cwd: tpl.WorkingDir, User: tpl.User})
		if err != nil {
			return err
		}
		defer s.Close()
		code, err := followBuild(s, logf)
		if err != nil {
			return err
		}
		if code != 0 {
			return errdefs.InvalidArgument(fmt.Sprintf("run %q exited with %d", st.Run, code))
		}
	case st.Copy != nil:
		data := []byte(st.Copy.Content)
		if st.Copy.ContentB64 != "" {
			data, _ = base64.StdEncoding.DecodeString(st.Copy.ContentB64)
		}
		if _, err := b.Agent().Upload(ctx, st.Copy.Path, os.FileMode(st.Copy.Mode), tpl.User, strings.NewReader(string(data))); err != nil {
			return err
		}
	}
	tmp := layer + ".tmp-" + b.ID()
	if err := b.ExportLayer(ctx, tmp); err != nil {
		return fmt.Errorf("export layer: %w", err)
	}
	m.crash.At(crashpoint.BuildLayer)
	if err := os.Rename(tmp, layer); err != nil {
		os.RemoveAll(tmp)
		//confine:host a template layer directory by the store's own path, not a path inside it
		if _, serr := os.Stat(layer); serr == nil {
			return nil // a concurrent build of the same step made it first
		}
		return err
	}
	return nil
}

// followBuild streams a build step's output as log lines and returns its exit code.
func followBuild(s *agent.ProcessStream, logf func(string)) (int, error) {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			logf("  " + sc.Text())
		}
		io.Copy(io.Discard, pr)
	}()
	defer func() { pw.Close(); <-done }()
	for {
		ev, err := s.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, errdefs.New(errdefs.ErrUnavailable, "build step ended without an exit status")
			}
			return 0, err
		}
		switch ev.Kind {
		case agent.EventStdout, agent.EventStderr, agent.EventPTY:
			pw.Write(ev.Data)
		case agent.EventEnd:
			return sandbox.ExitCode(ev), nil
		}
	}
}

// imageSource turns from.image into an image source: `oci:<dir>`, `docker-archive:<file>`, or
// a registry reference.
func imageSource(ref string) image.Source {
	if dir, ok := strings.CutPrefix(ref, "oci:"); ok {
		return image.Source{Layout: dir}
	}
	if file, ok := strings.CutPrefix(ref, "docker-archive:"); ok {
		return image.Source{Tarball: file}
	}
	return image.Source{Ref: ref}
}

// imageTemplate unpacks an image into a layer keyed by its digest (reused when it is there
// already) and returns it as a parent template carrying the image's Env, WorkingDir and User.
func (m *Builder) imageTemplate(ctx context.Context, ts *template.Store, ref string, logf func(string)) (sandbox.Template, error) {
	tmpKey := hashOf("image-download", ref+rand.Text())[:32]
	tmp, _, err := ts.LayerPath(tmpKey)
	if err != nil {
		return sandbox.Template{}, err
	}
	tmp += ".tmp"
	//confine:host a template layer directory by the store's own path, not a path inside it
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return sandbox.Template{}, err
	}
	defer os.RemoveAll(tmp)
	logf("pulling " + ref)
	cfg, err := image.Unpack(ctx, imageSource(ref), tmp, image.Options{Progress: logf, Logger: m.log})
	if err != nil {
		if errors.Is(err, errdefs.ErrUnavailable) {
			return sandbox.Template{}, errdefs.New(errdefs.ErrUpstream, err.Error())
		}
		return sandbox.Template{}, fmt.Errorf("from.image: %w", err)
	}
	// What every sandbox root needs: the agent's mount point, a /tmp, a user database.
	if err := prepareImageRoot(tmp); err != nil {
		return sandbox.Template{}, fmt.Errorf("from.image: %w", err)
	}
	layer, exists, err := ts.LayerPath(hashOf("image", cfg.Digest)[:32])
	if err != nil {
		return sandbox.Template{}, err
	}
	if !exists {
		if err := os.Rename(tmp, layer); err != nil {
			return sandbox.Template{}, err
		}
	}
	user, err := imageUser(layer, cfg.User)
	if err != nil {
		return sandbox.Template{}, fmt.Errorf("from.image: %w", err)
	}
	t := sandbox.Template{RootFS: layer, WorkingDir: cfg.WorkingDir, User: user}
	for _, kv := range cfg.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && sandbox.ValidEnvKey(k) {
			if t.Env == nil {
				t.Env = map[string]string{}
			}
			t.Env[k] = v
		}
	}
	logf(fmt.Sprintf("image %s is %s", ref, cfg.Digest))
	return t, nil
}

// imageUser resolves an image's User ("name", "uid", "name:group" or "uid:gid") to a user name
// of the image's /etc/passwd, which is what the agent runs commands as. The group part is not
// used: the user's own group applies. The image's files are read inside it (os.Root): its
// symlinks cannot point the read outside.
func imageUser(root, u string) (string, error) {
	u, _, _ = strings.Cut(u, ":")
	if u == "" {
		return "", nil
	}
	r, err := confine.Open(root)
	if err != nil {
		return "", err
	}
	defer r.Close()
	b, err := r.ReadFile("etc/passwd", 16<<20)
	if err != nil {
		return "", errdefs.InvalidArgument(fmt.Sprintf("image user %q: no /etc/passwd to find it in", u))
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 && (f[0] == u || f[2] == u) {
			return f[0], nil
		}
	}
	return "", errdefs.InvalidArgument(fmt.Sprintf("image user %q is not in the image's /etc/passwd", u))
}

// prepareImageRoot adds to an unpacked image what a sandbox root needs and images may lack. All
// of it happens through confine: a link in a hostile image is replaced, never written through.
func prepareImageRoot(dir string) error {
	r, err := confine.Open(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.EnsureFile(".space/space-agent", 0o755); err != nil {
		return err
	}
	if err := r.EnsureDir("tmp", 0o1777); err != nil {
		return err
	}
	if err := r.EnsureDir("etc", 0o755); err != nil {
		return err
	}
	if _, err := r.Lstat("etc/passwd"); errors.Is(err, os.ErrNotExist) {
		if err := r.WriteFile("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
			return err
		}
		if err := r.WriteFile("etc/group", []byte("root:x:0:\n"), 0o644); err != nil {
			return err
		}
	}
	return r.EnsureDir("root", 0o700)
}

// SandboxTemplate is what the lifecycle needs of a stored template.
func SandboxTemplate(t template.Template) sandbox.Template {
	tpl := sandbox.Template{RootFS: t.RootFS, Layers: t.Layers, Env: t.Env, WorkingDir: t.WorkingDir, User: t.User}
	if s := t.Start; s != nil {
		tpl.Start = &sandbox.Service{Command: s.Command, User: s.User, WorkingDir: s.WorkingDir, Env: s.Env, ReadyPort: s.ReadyPort, ReadyPath: s.ReadyPath}
	}
	return tpl
}

// storeStart is the inverse of SandboxTemplate's conversion of a service: a template built on
// one with a service keeps it.
func storeStart(s *sandbox.Service) *template.Start {
	if s == nil {
		return nil
	}
	return &template.Start{Command: s.Command, User: s.User, WorkingDir: s.WorkingDir, Env: s.Env, ReadyPort: s.ReadyPort, ReadyPath: s.ReadyPath}
}
