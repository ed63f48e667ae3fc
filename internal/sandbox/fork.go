package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/store"
)

// EventForked is published for each copy a fork makes.
const EventForked = "sandbox.forked"

// maxForkCount bounds one fork; forkParallel copies are restored at a time.
const (
	maxForkCount = 10
	forkParallel = 3
)

// Fork makes count independent running copies of a running sandbox's current state (memory,
// processes, files). Each copy has its own ID, access token and network slot, and records the
// parent. The parent keeps running. If any copy cannot be made, none is kept; the error says how
// many failed.
func (m *Manager) Fork(ctx context.Context, tenant, id string, count int) ([]Info, error) {
	if count < 1 || count > maxForkCount {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("count: want 1..%d", maxForkCount))
	}
	b, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	// The parent's state at one instant, taken while it keeps running. The fork waits its turn
	// behind other work on the parent; its time limit starts when it has it.
	b.mu.Lock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	if State(b.rec.State) == StatePaused {
		if err := m.resume(ctx, b); err != nil {
			b.mu.Unlock()
			return nil, err
		}
	}
	if State(b.rec.State) != StateRunning {
		b.mu.Unlock()
		return nil, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s, not running", id, b.rec.State))
	}
	cp, err := m.checkpointer(b)
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if err := m.roomForCheckpoint(ctx, b, "fork"); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	parent, parentSpec := b.rec, b.spec
	// The copies stand on the parent's shared layers too: a delete of the parent once its lock
	// is let go must not take them away before the copies are registered.
	for _, l := range parentSpec.Layers {
		defer m.pinLayer(l)()
	}
	dir := filepath.Join(m.cfg.StateDir, "forks", newID("fork_", 12))
	//confine:host spaced's state directory
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	err = cp.Checkpoint(ctx, id, dir, runtime.CheckpointOptions{LeaveRunning: true})
	b.mu.Unlock()
	defer os.RemoveAll(dir)
	if err != nil {
		return nil, fmt.Errorf("fork %s: checkpoint: %w", id, errdefs.NoSpace(err))
	}
	m.crash(crashpoint.ForkCheckpoint)

	// The copies share the parent's files as they were: one read-only layer under each copy's
	// own empty writable layer.
	layer, unpin, err := m.shareUpper(dir)
	if err != nil {
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	defer unpin()
	parentSpec.Layers = withLayer(parentSpec.Layers, layer)
	tpl := Template{RootFS: parentSpec.RootFS, Layers: parentSpec.Layers}
	// Copies restore a few at a time: each restore is mostly waiting on runsc.
	var (
		mu   sync.Mutex
		out  []Info
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, forkParallel)
	)
	for range count {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			info, err := m.forkOne(ctx, cp, parent, parentSpec, tpl, dir)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			out = append(out, info)
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		// All or nothing: the caller learns no IDs, so the copies that were made go too.
		for _, c := range out {
			if err := m.Delete(ctx, tenant, c.ID); err != nil {
				m.log.Error("remove copy of a failed fork", "id", c.ID, "err", err)
			}
		}
		unpin()
		m.gcLayers(ctx)
		return nil, fmt.Errorf("fork %s: %d of %d copies failed: %w", id, len(errs), count, errors.Join(errs...))
	}
	return out, nil
}

// forkOne restores one copy of parent from the checkpoint in dir.
func (m *Manager) forkOne(ctx context.Context, cp runtime.Checkpointer, parent store.Sandbox, spec Spec, tpl Template, dir string) (Info, error) {
	if err := m.reserve(parent.Tenant); err != nil {
		return Info{}, err
	}
	defer m.unreserve(parent.Tenant)
	now := m.cfg.Now().UTC()
	rec := parent
	rec.ID, rec.AccessToken, rec.State, rec.SlotIndex, rec.Error = newID("sbx_", 20), newToken(), string(StateCreating), -1, ""
	rec.CreatedAt, rec.UpdatedAt = now, now
	rec.ExpiresAt = now.Add(time.Duration(max(rec.TimeoutSeconds, 1)) * time.Second)
	spec.Parent = &Parent{SandboxID: parent.ID}
	rec.Spec = encodeSpec(spec)
	if err := m.recordNew(ctx, rec, spec); err != nil {
		return Info{}, err
	}
	nb := newBox(rec, spec)
	nb.mu.Lock()
	defer nb.mu.Unlock()
	m.register(nb)
	err := func() error {
		slot, err := m.cfg.Slots.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("network slot: %w", err)
		}
		nb.slot, nb.rec.SlotIndex = slot, slot.Index
		if err := m.cfg.Store.UpdateSandbox(ctx, nb.rec); err != nil {
			return err
		}
		if err := cp.Restore(ctx, m.runtimeSpec(nb, tpl), dir); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		// The copy's agent still holds the parent's token (it is the parent's memory): give it
		// its own before anyone else can reach it with the parent's.
		old := agent.NewClient(m.cfg.AgentURL(slot), parent.AccessToken, m.newHTTPClient())
		rctx, rcancel := context.WithTimeout(ctx, m.cfg.ReadyTimeout)
		defer rcancel()
		if err := old.WaitReady(rctx); err != nil {
			return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("copy did not answer: %v", err))
		}
		if err := old.Rotate(rctx, nb.rec.AccessToken); err != nil {
			return fmt.Errorf("give the copy its token: %w", err)
		}
		m.crash(crashpoint.ForkCopy)
		m.setClient(nb)
		return m.setState(ctx, nb, StateRunning, "")
	}()
	if err != nil {
		m.abandon(ctx, nb)
		return Info{}, err
	}
	m.publish(EventForked, nb.rec, "from "+parent.ID)
	m.log.Info("sandbox forked", "id", nb.rec.ID, "parent", parent.ID)
	return *nb.view.Load(), nil
}
