package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
)

// Built ("user") templates are made by SPACE from build steps or OCI images. Each is a JSON file
// <Dir>/.user/<name>.json naming its layers, which live in <Dir>/.layers/<key>/ and are shared
// between templates (a layer's key identifies how it was made, so an unchanged build step finds
// its layer again). A layer no template names and no sandbox has mounted is removed by Delete.

var (
	nameRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	layerKeyRE = regexp.MustCompile(`^[0-9a-f]{16,64}$`)
)

func (s *Store) userDir() string  { return filepath.Join(s.userRoot, ".user") }
func (s *Store) layerDir() string { return filepath.Join(s.userRoot, ".layers") }

// LayerPath returns where the layer with key lives and whether it exists. A layer is made by
// creating it under a temporary name in the same directory and renaming it to path.
func (s *Store) LayerPath(key string) (path string, exists bool, err error) {
	if !layerKeyRE.MatchString(key) {
		return "", false, errdefs.InvalidArgument(fmt.Sprintf("layer key %q", key))
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if err := os.MkdirAll(s.layerDir(), 0o755); err != nil {
		return "", false, err
	}
	path = filepath.Join(s.layerDir(), key)
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	_, err = os.Stat(path)
	return path, err == nil, nil
}

// Save records a built template. Its name must not be a built-in one; saving an existing name
// replaces it (a rebuild).
func (s *Store) Save(ctx context.Context, t Template) (Template, error) {
	if !nameRE.MatchString(t.Name) {
		return Template{}, errdefs.InvalidArgument(fmt.Sprintf("template name %q: lowercase letters, digits, '.', '_' and '-', up to 63", t.Name))
	}
	if _, ok := s.recipes[t.Name]; ok {
		return Template{}, errdefs.New(errdefs.ErrAlreadyExists, fmt.Sprintf("template %q is built in", t.Name))
	}
	if t.RootFS == "" {
		return Template{}, errdefs.InvalidArgument("template without a root filesystem")
	}
	var size int64
	for _, dir := range append([]string{t.RootFS}, t.Layers...) {
		n, err := treeSize(dir)
		if err != nil {
			return Template{}, fmt.Errorf("template %s: %w", t.Name, err)
		}
		size += n
	}
	t.SizeBytes, t.CreatedAt, t.Version = size, time.Now().UTC(), ""
	// The template stands on its root filesystem (a built-in template's version, or an image's
	// layer) until it is deleted or rebuilt on another one.
	if _, err := s.target(t.RootFS); err == nil {
		if err := s.Hold(ctx, s.templateHolder(t.Name), t.RootFS); err != nil {
			return Template{}, fmt.Errorf("template %s: %w", t.Name, err)
		}
	}
	old, oldErr := s.loadUser(t.Name)
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return Template{}, err
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if err := os.MkdirAll(s.userDir(), 0o755); err != nil {
		return Template{}, err
	}
	if err := durable.WriteFile(filepath.Join(s.userDir(), t.Name+".json"), b, 0o600); err != nil {
		return Template{}, err
	}
	if oldErr == nil && old.RootFS != t.RootFS {
		if err := s.releaseRootFS(t.Name, old.RootFS); err != nil {
			s.log.WarnContext(ctx, "release the old root filesystem of a rebuilt template", "template", t.Name, "err", err)
		}
	}
	s.log.InfoContext(ctx, "saved template", "template", t.Name, "parent", t.Parent, "layers", len(t.Layers), "size_bytes", size)
	return t, nil
}

func (s *Store) loadUser(name string) (Template, error) {
	if !nameRE.MatchString(name) {
		return Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	b, err := os.ReadFile(filepath.Join(s.userDir(), name+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Template{}, errdefs.NotFound(fmt.Sprintf("template %q not found", name))
	}
	if err != nil {
		return Template{}, err
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return Template{}, fmt.Errorf("template %s: %w", name, err)
	}
	return t, nil
}

func (s *Store) listUser() ([]Template, error) {
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	entries, err := os.ReadDir(s.userDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Template
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		t, err := s.loadUser(name)
		if err != nil {
			s.log.Warn("skipping unreadable template", "template", name, "err", err)
			continue
		}
		out = append(out, t)
	}
	return out, nil
}

// Delete removes a built template, drops its reference on its root filesystem, then removes every
// layer that no template names, nothing references, no sandbox has mounted and keep (if given:
// the layers sandboxes were started on, for those that hold no references) does not list.
// Layers are collected only while no build runs (else at the end of the last one). Built-in
// templates cannot be deleted.
func (s *Store) Delete(ctx context.Context, name string, keep func() []string) error {
	if _, ok := s.recipes[name]; ok {
		return errdefs.Conflict(fmt.Sprintf("template %q is built in and cannot be deleted", name))
	}
	t, err := s.loadUser(name)
	if err != nil {
		return err
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	if err := os.Remove(filepath.Join(s.userDir(), name+".json")); err != nil {
		return err
	}
	if err := durable.Sync(s.userDir()); err != nil {
		return err
	}
	if err := s.releaseRootFS(name, t.RootFS); err != nil {
		return err
	}
	return s.collectLayers(ctx, keep)
}

// releaseRootFS drops built template name's reference on rootfs, if rootfs is the store's.
func (s *Store) releaseRootFS(name, rootfs string) error {
	if _, err := s.target(rootfs); err != nil {
		return nil
	}
	return s.Release(s.templateHolder(name), rootfs)
}

// collectLayers removes layers that no template names, nothing references and no mount uses,
// with leftovers of interrupted builds, if no build runs in any instance sharing UserDir;
// otherwise it leaves that to the end of the last build.
func (s *Store) collectLayers(ctx context.Context, keep func() []string) error {
	unlock, err := s.tryBuildsExclusive()
	if err != nil {
		return err
	}
	if unlock == nil {
		s.layerGCPending.Store(true)
		s.log.DebugContext(ctx, "template layer collection put off: a build is running")
		return nil
	}
	defer unlock()
	s.layerGCPending.Store(false)
	all, err := s.listUser()
	if err != nil {
		return err
	}
	used := map[string]bool{}
	if keep != nil {
		for _, l := range keep() {
			used[l] = true
		}
	}
	for _, t := range all {
		used[t.RootFS] = true
		for _, l := range t.Layers {
			used[l] = true
		}
	}
	//confine:host the template store's own directories and metadata files, not paths inside a template tree
	entries, err := os.ReadDir(s.layerDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var trash []string
	err = s.withGCLock(ctx, s.userRoot, func() error {
		mounted := overlayLowerDirs()
		for _, e := range entries {
			dir := filepath.Join(s.layerDir(), e.Name())
			switch {
			case strings.HasPrefix(e.Name(), trashPrefix), strings.Contains(e.Name(), ".tmp"):
				// No build runs: a temp dir is what an interrupted one left.
				trash = append(trash, dir)
			case used[dir]:
			default:
				t, err := s.target(dir)
				if err != nil {
					continue // not a layer of ours
				}
				if moved, ok := s.setAside(ctx, t, mounted); ok {
					trash = append(trash, moved)
				}
			}
		}
		return nil
	})
	s.removeTrash(ctx, trash)
	return err
}
