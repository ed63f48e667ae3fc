package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/errdefs"
)

// Delete removes a sandbox and everything it had. It is not an error to delete a sandbox that is
// in state error.
func (m *Manager) Delete(ctx context.Context, tenant, id string) error {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return err
	}
	return m.remove(ctx, b, EventDeleted, "")
}

// remove deletes b and publishes evt. It waits its turn behind an operation under way on b (a
// snapshot, a restore, a fork's checkpoint), however long that takes; its own time limit starts
// when it gets b. Work continues if ctx ends: a half-deleted sandbox helps no one.
func (m *Manager) remove(ctx context.Context, b *box, evt, reason string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if State(b.rec.State) == StateDeleted {
		return errdefs.NotFound(fmt.Sprintf("sandbox %s not found", b.rec.ID))
	}
	if evt == EventExpired && (State(b.rec.State) != StateRunning || !m.cfg.Now().After(b.rec.ExpiresAt)) {
		return nil // its timeout was extended (or it changed state) since the reaper looked
	}
	if State(b.rec.State) != StateDeleting { // a retry of a delete that failed half-way goes on
		if err := m.setState(ctx, b, StateDeleting, reason); err != nil {
			return err
		}
	}
	m.crash(crashpoint.DeleteDeleting)
	if err := m.teardown(ctx, b); err != nil {
		_ = m.setState(ctx, b, StateError, err.Error())
		return fmt.Errorf("delete sandbox %s: %w", b.rec.ID, err)
	}
	m.crash(crashpoint.DeleteTornDown)
	if err := m.setState(ctx, b, StateDeleted, reason); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.boxes, b.rec.ID)
	m.mu.Unlock()
	m.publish(evt, b.rec, reason)
	if m.cfg.Audit != nil {
		m.cfg.Audit.Forget(b.rec.ID)
	}
	m.log.Info("sandbox removed", "id", b.rec.ID, "event", evt)
	if m.onSharedLayer(b.spec) {
		m.gcLayers(ctx) // it may have been the last user
	}
	return nil
}

// Get returns a sandbox of tenant.
func (m *Manager) Get(ctx context.Context, tenant, id string) (Info, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	return *b.view.Load(), nil
}

// ListFilter selects sandboxes in List.
type ListFilter struct {
	States   []string
	Metadata map[string]string
}

// List returns tenant's sandboxes that match f, oldest first.
func (m *Manager) List(ctx context.Context, tenant string, f ListFilter) ([]Info, error) {
	for _, s := range f.States {
		if !ValidState(s) {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("state %q is not a sandbox state", s))
		}
	}
	recs, err := m.cfg.Store.ListSandboxes(ctx, storeFilter(tenant, f))
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(recs))
	for _, r := range recs {
		spec, err := decodeSpec(r.Spec)
		if err != nil {
			return nil, err
		}
		out = append(out, infoOf(r, spec))
	}
	return out, nil
}

// SetTimeout makes the sandbox expire seconds from now.
func (m *Manager) SetTimeout(ctx context.Context, tenant, id string, seconds int) (Info, error) {
	if seconds <= 0 || seconds > int(m.cfg.MaxTimeout/time.Second) {
		return Info{}, errdefs.InvalidArgument(fmt.Sprintf("timeout_seconds: want 1..%d", int(m.cfg.MaxTimeout.Seconds())))
	}
	b, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.rec.State) != StateRunning {
		return Info{}, errdefs.Conflict(fmt.Sprintf("sandbox is %s", b.rec.State))
	}
	prev := b.rec
	now := m.cfg.Now().UTC()
	b.rec.ExpiresAt = now.Add(time.Duration(seconds) * time.Second)
	b.rec.TimeoutSeconds = seconds
	b.rec.UpdatedAt = now
	defer b.refresh()
	if err := m.cfg.Store.UpdateSandbox(ctx, b.rec); err != nil {
		b.rec = prev
		return Info{}, err
	}
	return infoOf(b.rec, b.spec), nil
}

// Counts returns how many sandboxes are in each state.
func (m *Manager) Counts() map[string]int {
	out := map[string]int{}
	for _, b := range m.snapshotBoxes() {
		out[string(b.view.Load().State)]++
	}
	return out
}
