package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/store"
)

// What template builds (internal/template/build) need of the lifecycle: its build.Lifecycle.

// Template resolves a template by name (Config.Templates).
func (m *Manager) Template(ctx context.Context, name string) (Template, error) {
	return m.cfg.Templates(ctx, name)
}

// CanBuild reports nil if the default runtime can hand over a build sandbox's writable layer.
func (m *Manager) CanBuild() error {
	if _, ok := m.cfg.Drivers[m.cfg.DefaultRuntime].(runtime.LayerExporter); !ok {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("runtime %s cannot build templates", m.cfg.DefaultRuntime))
	}
	return nil
}

// BuildSandbox is a running build sandbox: hidden from tenants (it is recorded under the warm
// pool's tenant, so recovery removes it after a crash) and locked until Remove.
type BuildSandbox struct {
	m *Manager
	b *box
}

// StartBuild starts a build sandbox of the default shape on tpl and returns once its agent
// answers. The caller must call Remove.
func (m *Manager) StartBuild(ctx context.Context, tpl Template) (*BuildSandbox, error) {
	if err := m.CanBuild(); err != nil {
		return nil, err
	}
	rec, spec, err := m.prepare(ctx, warmTenant, CreateRequest{})
	if err != nil {
		return nil, err
	}
	rec.ExpiresAt, rec.TimeoutSeconds = time.Time{}, 0
	// A build runs its steps in the template's tree, not its service (which would write its
	// state into the layer being built).
	tpl.Start = nil
	b := newBox(rec, spec)
	applyTemplate(b, tpl)
	if err := m.recordNew(ctx, b.rec, b.spec); err != nil {
		return nil, err
	}
	b.mu.Lock()
	bs := &BuildSandbox{m: m, b: b}
	if err := m.start(ctx, b, m.cfg.Drivers[rec.Runtime], tpl); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := bs.Remove(cctx); derr != nil {
			m.log.Error("remove build sandbox", "id", b.rec.ID, "err", derr)
		}
		return nil, err
	}
	return bs, nil
}

// ID is the build sandbox's ID.
func (s *BuildSandbox) ID() string { return s.b.id }

// Agent is the build sandbox's agent.
func (s *BuildSandbox) Agent() *agent.Client { return s.b.client }

// ExportLayer stops the build sandbox and moves its writable layer to dest (which must not
// exist).
func (s *BuildSandbox) ExportLayer(ctx context.Context, dest string) error {
	exp, ok := s.m.cfg.Drivers[s.b.rec.Runtime].(runtime.LayerExporter)
	if !ok {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("runtime %s cannot build templates", s.b.rec.Runtime))
	}
	return exp.ExportLayer(ctx, s.b.rec.ID, dest)
}

// Remove tears the build sandbox down and removes its record; call it once.
func (s *BuildSandbox) Remove(ctx context.Context) error {
	defer s.b.mu.Unlock()
	return s.m.drop(ctx, s.b)
}

// LayersInUse lists the layers every sandbox (running, paused or otherwise) was started on and
// every snapshot was taken on (it is restored onto them).
func (m *Manager) LayersInUse() []string {
	var out []string
	for _, b := range m.snapshotBoxes() {
		v := b.view.Load()
		out = append(out, v.Spec.RootFS)
		out = append(out, v.Spec.Layers...)
	}
	if m.cfg.Chunks != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		snaps, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{})
		if err != nil {
			m.log.Error("list snapshots for layers in use", "err", err)
		}
		for _, s := range snaps {
			if mf, err := m.readManifest(s.ID); err == nil {
				out = append(out, mf.RootFS)
				out = append(out, mf.Layers...)
			}
		}
	}
	return out
}

// ValidTemplateName reports whether s has the shape of a template name.
func ValidTemplateName(s string) bool { return nameRE.MatchString(s) }

// ValidEnvKey reports whether k may name an environment variable.
func ValidEnvKey(k string) bool { return envKeyRE.MatchString(k) }

// ValidateEnv checks an environment map as create and exec do; field names it in the error.
func ValidateEnv(field string, env map[string]string) error { return validateMap(field, env, envKeyRE) }

// ExitCode turns an agent end event into a shell-style exit code: 128+n for death by signal n.
func ExitCode(ev agent.Event) int { return exitCode(ev) }
