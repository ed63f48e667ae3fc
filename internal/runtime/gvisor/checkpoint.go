package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// A checkpoint directory holds runsc's image (checkpoint.img, pages*.img), the writable layer
// as it was at that instant (upper/), the agent binary the checkpointed memory runs (space-agent)
// and manifestFile, written last, which marks the directory as a complete gVisor checkpoint.
const (
	manifestFile   = "gvisor-checkpoint.json"
	manifestFormat = 1
)

type manifest struct {
	Driver    string    `json:"driver"`
	Format    int       `json:"format"`
	SandboxID string    `json:"sandboxID"`
	RootFS    string    `json:"rootFS"` // template the writable layer and memory belong to
	CreatedAt time.Time `json:"createdAt"`
}

// Checkpoint implements runtime.Checkpointer. dir must be empty or not exist. With LeaveRunning
// the sandbox is paused while runsc saves it and its writable layer is copied, then resumed, so
// memory and files in dir are of the same instant; without it the sandbox is stopped afterwards
// (State reports StateStopped until Delete). With Durable, dir is on disk when it returns.
func (d *Driver) Checkpoint(ctx context.Context, id, dir string, opts runtime.CheckpointOptions) (err error) {
	leaveRunning := opts.LeaveRunning
	st, err := d.State(ctx, id)
	if err != nil {
		return err
	}
	switch st {
	case runtime.StateUnknown:
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, errdefs.ErrNotFound)
	case runtime.StateStopped:
		return fmt.Errorf("gvisor: checkpoint %s: sandbox is stopped: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err := emptyDir(dir); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			clearDir(dir)
		}
	}()
	start := time.Now()
	args := []string{"checkpoint", "--image-path=" + dir}
	if leaveRunning {
		args = append(args, "--leave-running")
		// runsc resumes the sandbox right after saving its memory; keep it paused until the
		// writable layer is copied too. Pauses nest, so a paused sandbox stays paused.
		if st == runtime.StateRunning {
			if _, err := d.runsc(ctx, id, "pause", id); err != nil {
				return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
			}
			defer func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				defer cancel()
				if _, rerr := d.runsc(rctx, id, "resume", id); rerr != nil {
					err = errors.Join(err, fmt.Errorf("gvisor: resume %s after checkpoint: %w", id, rerr))
				}
			}()
		}
	}
	if _, err := d.runsc(ctx, id, append(args, id)...); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	saved := time.Since(start)
	if !leaveRunning {
		// runsc returns once the image is written; the sandbox exits just after.
		if err := d.waitStopped(ctx, id); err != nil {
			return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
		}
	}
	sb := d.sandboxDir(id)
	if err := os.Mkdir(filepath.Join(dir, "upper"), 0o755); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	if err := copyTree(d.upperDir(id), filepath.Join(dir, "upper")); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: copy writable layer: %w", id, err)
	}
	if err := copyFile(sb, agentFile, filepath.Join(dir, agentFile), 0o755); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: copy agent: %w", id, err)
	}
	info, err := d.readInfo(id)
	if err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	if err := writeManifest(dir, manifest{SandboxID: id, RootFS: info.RootFS}, opts.Durable); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	d.log.InfoContext(ctx, "sandbox checkpointed", "id", id, "leave_running", leaveRunning,
		"save", saved.Round(time.Millisecond), "total", time.Since(start).Round(time.Millisecond))
	return nil
}

// Restore implements runtime.Checkpointer: a new sandbox spec.ID, in spec's network slot, from a
// directory written by Checkpoint. The same directory may be restored many times; it is not
// needed after Restore returns.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	m, err := readManifest(dir)
	if err != nil {
		return fmt.Errorf("gvisor: restore %s: %w", spec.ID, err)
	}
	// The checkpointed memory maps files of its template, and the writable layer is a diff
	// against it. A template at another path may be a copy; a rebuilt one would corrupt the
	// sandbox, which the caller must prevent by keeping the version a checkpoint was made on.
	if m.RootFS != "" && m.RootFS != spec.RootFS {
		d.log.WarnContext(ctx, "restoring onto another template path than the checkpoint's",
			"id", spec.ID, "checkpoint_rootfs", m.RootFS, "rootfs", spec.RootFS)
	}
	return d.start(ctx, spec, dir)
}

// writeManifest writes m last, so that a manifest never describes missing data; with mustSync,
// after making the rest of dir durable, and itself atomically and durably.
func writeManifest(dir string, m manifest, mustSync bool) error {
	m.Driver, m.Format, m.CreatedAt = Name, manifestFormat, time.Now().UTC()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if !mustSync {
		//confine:host the checkpoint directory itself or its manifest, which only the driver writes (upper/ goes through confine)
		return os.WriteFile(filepath.Join(dir, manifestFile), b, 0o644)
	}
	// Everything else first, so that a manifest never describes missing data.
	if err := durable.SyncTree(dir); err != nil {
		return err
	}
	return durable.WriteFile(filepath.Join(dir, manifestFile), b, 0o644)
}

func readManifest(dir string) (manifest, error) {
	var m manifest
	//confine:host the checkpoint directory itself or its manifest, which only the driver writes (upper/ goes through confine)
	b, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		//confine:host the checkpoint directory itself or its manifest, which only the driver writes (upper/ goes through confine)
		if _, serr := os.Stat(dir); serr != nil {
			return m, fmt.Errorf("checkpoint %s: %w", dir, errdefs.ErrNotFound)
		}
		return m, errdefs.InvalidArgument(fmt.Sprintf("%s is not a complete gVisor checkpoint", dir))
	}
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Driver != Name {
		return m, errdefs.InvalidArgument(fmt.Sprintf("%s is not a gVisor checkpoint", dir))
	}
	if m.Format != manifestFormat {
		return m, errdefs.InvalidArgument(fmt.Sprintf("checkpoint %s has format %d, this driver reads %d", dir, m.Format, manifestFormat))
	}
	return m, nil
}

// emptyDir makes sure dir exists and is empty.
func emptyDir(dir string) error {
	//confine:host the checkpoint directory itself or its manifest, which only the driver writes (upper/ goes through confine)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	//confine:host the checkpoint directory itself or its manifest, which only the driver writes (upper/ goes through confine)
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
	//confine:host the checkpoint directory itself or its manifest, which only the driver writes (upper/ goes through confine)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// waitStopped waits until runsc no longer reports id as running or paused.
func (d *Driver) waitStopped(ctx context.Context, id string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, known, err := d.runscState(ctx, id)
		if err != nil {
			return err
		}
		if !known || (status != "running" && status != "paused") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox still %s after checkpoint", status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
