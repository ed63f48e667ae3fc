package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

// TemplateRefs records which template versions and layers each sandbox and snapshot stands on,
// on the file system of the templates directory, so that no rebuild of a template (by this
// instance or another sharing the directory) removes one still in use: running, paused or in
// error. template.Store implements it. Holders are "<instance>/<sandbox or snapshot ID>".
type TemplateRefs interface {
	// Hold references paths (a template's RootFS and Layers) for holder, durably, all or none;
	// ErrNotFound if one is gone.
	Hold(ctx context.Context, holder string, paths ...string) error
	// Release drops holder's references to paths.
	Release(holder string, paths ...string) error
	// Reconcile drops the references of holders with the prefix that live says are gone.
	Reconcile(ctx context.Context, holderPrefix string, live func(holder string) bool) error
	// GC removes versions and layers nothing references any more.
	GC(ctx context.Context) error
}

// holder names what stands on templates: a sandbox or a snapshot of this instance.
func (m *Manager) holder(id string) string { return m.cfg.Instance + "/" + id }

// templatePaths are the template directories among a root and layers: shared layers under the
// state directory are spaced's own (layers.go).
func (m *Manager) templatePaths(rootfs string, layers []string) []string {
	var out []string
	own := m.layersDir() + string(filepath.Separator)
	for _, p := range append([]string{rootfs}, layers...) {
		if p != "" && (m.cfg.StateDir == "" || !strings.HasPrefix(p, own)) {
			out = append(out, p)
		}
	}
	return out
}

// holdTemplates records that id stands on rootfs and layers. Call it before the record that
// names them is stored: a crash in between leaves a reference no record names, which Recover
// drops.
func (m *Manager) holdTemplates(ctx context.Context, id, rootfs string, layers []string) error {
	if m.cfg.TemplateRefs == nil {
		return nil
	}
	paths := m.templatePaths(rootfs, layers)
	if len(paths) == 0 {
		return nil
	}
	if err := m.cfg.TemplateRefs.Hold(ctx, m.holder(id), paths...); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.New(errdefs.ErrUnavailable, "the template version this needs was removed meanwhile; retry")
		}
		return err
	}
	return nil
}

// recordNew stores the record of a new sandbox (state creating) whose spec stands on templates:
// their references first, then the record; a record that cannot be stored lets them go again.
// Every new sandbox record is made here (create, fork copy, create from a snapshot, build
// sandbox), except the warm pool's, whose template is known only later.
func (m *Manager) recordNew(ctx context.Context, rec store.Sandbox, spec Spec) error {
	if err := m.holdTemplates(ctx, rec.ID, spec.RootFS, spec.Layers); err != nil {
		return fmt.Errorf("template %s: %w", rec.Template, err)
	}
	if err := m.cfg.Store.CreateSandbox(ctx, rec); err != nil {
		m.releaseTemplates(rec.ID, spec.RootFS, spec.Layers)
		return fmt.Errorf("record sandbox: %w", err)
	}
	return nil
}

// releaseTemplates drops id's references (after its record is gone).
func (m *Manager) releaseTemplates(id, rootfs string, layers []string) {
	if m.cfg.TemplateRefs == nil {
		return
	}
	if paths := m.templatePaths(rootfs, layers); len(paths) > 0 {
		if err := m.cfg.TemplateRefs.Release(m.holder(id), paths...); err != nil {
			m.log.Warn("release template references", "holder", m.holder(id), "err", err)
		}
	}
}

// reconcileTemplateRefs (at start, after recovery) makes the references match the records:
// every sandbox and snapshot holds what it stands on (also those from before references were
// kept), references of holders that are gone are dropped, and what nothing holds is collected.
func (m *Manager) reconcileTemplateRefs(ctx context.Context) {
	if m.cfg.TemplateRefs == nil {
		return
	}
	live := map[string]bool{}
	for _, b := range m.snapshotBoxes() {
		spec := b.view.Load().Spec
		live[m.holder(b.id)] = true
		if err := m.holdTemplates(ctx, b.id, spec.RootFS, spec.Layers); err != nil {
			m.log.Warn("hold templates of a sandbox", "id", b.id, "err", err)
		}
	}
	if m.snaps != nil {
		snaps, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{})
		if err != nil {
			m.log.Error("list snapshots for template references; keeping every reference", "err", err)
			return
		}
		for _, s := range snaps {
			live[m.holder(s.ID)] = true
			mf, err := m.snaps.Read(s.ID)
			if err != nil {
				m.log.Warn("read snapshot for template references", "snapshot", s.ID, "err", err)
				continue
			}
			if err := m.holdTemplates(ctx, s.ID, mf.RootFS, mf.Layers); err != nil {
				m.log.Warn("hold templates of a snapshot", "snapshot", s.ID, "err", err)
			}
		}
	}
	if err := m.cfg.TemplateRefs.Reconcile(ctx, m.holder(""), func(h string) bool { return live[h] }); err != nil {
		m.log.Error("reconcile template references", "err", err)
		return
	}
	if err := m.cfg.TemplateRefs.GC(ctx); err != nil {
		m.log.Warn("collect unused template versions", "err", err)
	}
}
