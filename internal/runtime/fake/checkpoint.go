package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/confine"
	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// A checkpoint directory holds the writable layer (layer/) and ManifestFile, written last.
const (
	ManifestFile   = "fake-checkpoint.json"
	manifestFormat = 1
)

type manifest struct {
	Driver    string    `json:"driver"`
	Format    int       `json:"format"`
	SandboxID string    `json:"sandboxID"`
	CreatedAt time.Time `json:"createdAt"`
	// AgentToken is the token the agent held: Restore's agent demands it (see the package doc).
	AgentToken string `json:"agentToken"`
}

// Checkpoint implements runtime.Checkpointer: see the package doc. dir must be empty or not
// exist. A paused sandbox may be checkpointed (it stays paused with LeaveRunning).
func (d *Driver) Checkpoint(ctx context.Context, id, dir string, opts runtime.CheckpointOptions) (err error) {
	inst, err := d.lookup("checkpoint", id)
	if err != nil {
		return err
	}
	if err := d.pause(inst, true); err != nil {
		return fmt.Errorf("fake: checkpoint %s: %w", id, err)
	}
	defer func() {
		if err != nil || opts.LeaveRunning {
			d.resume(inst, false)
		} else {
			d.stop(inst)
		}
	}()
	if err := emptyDir(dir); err != nil {
		return fmt.Errorf("fake: checkpoint %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			clearDir(dir)
		}
	}()
	if d.OnPause != nil {
		if err := d.OnPause(ctx, OpCheckpoint, id); err != nil {
			return fmt.Errorf("fake: checkpoint %s: %w", id, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fake: checkpoint %s: %w", id, err)
	}
	if d.CheckpointSpace > 0 {
		size, err := layerSize(inst.layer())
		if err != nil {
			return fmt.Errorf("fake: checkpoint %s: %w", id, err)
		}
		if size > d.CheckpointSpace {
			return fmt.Errorf("fake: checkpoint %s: write %s: %w", id, dir, syscall.ENOSPC)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "upper"), 0o755); err != nil {
		return fmt.Errorf("fake: checkpoint %s: %w", id, err)
	}
	if err := copyTree(inst.layer(), filepath.Join(dir, "upper")); err != nil {
		return fmt.Errorf("fake: checkpoint %s: copy writable layer: %w", id, err)
	}
	if err := writeManifest(dir, manifest{SandboxID: id, AgentToken: inst.currentToken()}, opts.Durable); err != nil {
		return fmt.Errorf("fake: checkpoint %s: %w", id, err)
	}
	return nil
}

// Restore implements runtime.Checkpointer: a new sandbox spec.ID over a copy of the layer of
// the checkpoint in dir, its agent demanding the checkpointed agent's token (not
// spec.AgentToken). Processes are not restored.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	m, err := readManifest(dir)
	if err != nil {
		return fmt.Errorf("fake: restore %s: %w", spec.ID, err)
	}
	return d.start(ctx, spec, filepath.Join(dir, "upper"), m.AgentToken)
}

func layerSize(dir string) (int64, error) {
	root, err := confine.Open(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	return root.Size("")
}

// writeManifest writes m last; with mustSync after making the rest of dir durable, and itself
// atomically and durably.
func writeManifest(dir string, m manifest, mustSync bool) error {
	m.Driver, m.Format, m.CreatedAt = "fake", manifestFormat, time.Now().UTC()
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if !mustSync {
		return os.WriteFile(filepath.Join(dir, ManifestFile), b, 0o644)
	}
	if err := durable.SyncTree(dir); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+ManifestFile)
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := durable.Sync(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, ManifestFile)); err != nil {
		return err
	}
	return durable.Sync(dir)
}

func readManifest(dir string) (manifest, error) {
	var m manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return m, fmt.Errorf("checkpoint %s: %w", dir, errdefs.ErrNotFound)
		}
		return m, errdefs.InvalidArgument(fmt.Sprintf("%s is not a complete fake checkpoint", dir))
	}
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Driver != "fake" || m.Format != manifestFormat {
		return m, errdefs.InvalidArgument(fmt.Sprintf("%s is not a fake checkpoint of format %d", dir, manifestFormat))
	}
	return m, nil
}

// emptyDir makes sure dir exists and is empty.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return errdefs.InvalidArgument(fmt.Sprintf("checkpoint directory %s is not empty", dir))
	}
	return nil
}

// clearDir removes what a failed checkpoint wrote into dir, leaving dir itself.
func clearDir(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}
