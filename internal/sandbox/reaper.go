package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"

	"github.com/space-sandbox/space/internal/runtime"
)

// reaper removes expired sandboxes and notices runtimes that died.
func (m *Manager) reaper() {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.ReapInterval)
	defer tick.Stop()
	lastHealth := m.cfg.Now()
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
		ctx := context.Background()
		now := m.cfg.Now()
		for _, b := range m.expired(now) {
			if b.view.Load().OnTimeout == "pause" {
				if _, err := m.Pause(ctx, b.tenant, b.id); err != nil {
					m.log.Error("pause expired sandbox", "id", b.id, "err", err)
				}
				continue
			}
			if err := m.remove(ctx, b, EventExpired, "timeout"); err != nil {
				m.log.Error("remove expired sandbox", "id", b.id, "err", err)
			}
		}
		if now.Sub(lastHealth) >= m.cfg.HealthInterval {
			lastHealth = now
			m.checkHealth(ctx)
		}
	}
}

func (m *Manager) snapshotBoxes() []*box {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*box, 0, len(m.boxes))
	for _, b := range m.boxes {
		out = append(out, b)
	}
	return out
}

func (m *Manager) expired(now time.Time) []*box {
	var out []*box
	for _, b := range m.snapshotBoxes() {
		if !b.mu.TryLock() {
			continue // busy: look again next tick
		}
		if State(b.rec.State) == StateRunning && !b.rec.ExpiresAt.IsZero() && now.After(b.rec.ExpiresAt) {
			out = append(out, b)
		}
		b.mu.Unlock()
	}
	return out
}

// checkHealth marks running sandboxes whose runtime is gone as crashed and frees their resources.
func (m *Manager) checkHealth(ctx context.Context) {
	for _, b := range m.snapshotBoxes() {
		if !b.mu.TryLock() {
			continue
		}
		if State(b.rec.State) != StateRunning {
			b.mu.Unlock()
			continue
		}
		st, err := m.cfg.Drivers[b.rec.Runtime].State(ctx, b.rec.ID)
		if err == nil && st != runtime.StateRunning {
			m.log.Warn("sandbox runtime died", "id", b.rec.ID, "state", st)
			if !m.recoverFromSnapshot(ctx, b, "runtime is "+string(st)) {
				m.crashed(ctx, b, "runtime is "+string(st))
			}
		}
		b.mu.Unlock()
	}
}

// probe checks one sandbox's runtime now (after a broken stream to its agent). If the runtime is
// gone it handles the crash and returns an error saying so; otherwise nil.
func (m *Manager) probe(tenant, id string) error {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.rec.State) != StateRunning {
		if State(b.rec.State) == StateError {
			return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s stopped: %s", id, b.rec.Error))
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A runtime that is going away can still look alive for a moment (runsc reports a dying
	// sandbox as running for a second or two): look a few times before deciding it lives.
	var st runtime.State
	for i := 0; ; i++ {
		st, err = m.cfg.Drivers[b.rec.Runtime].State(ctx, id)
		if err != nil || st != runtime.StateRunning {
			break
		}
		if i == 30 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil
	}
	reason := "runtime is " + string(st)
	m.log.Warn("sandbox runtime died", "id", id, "state", st)
	if m.recoverFromSnapshot(ctx, b, reason) {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s stopped (%s) and was brought back from its latest full snapshot", id, reason))
	}
	m.crashed(ctx, b, reason)
	return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s stopped: %s", id, reason))
}

// crashed moves b to error after its runtime died and frees what it held. The caller holds b.mu.
func (m *Manager) crashed(ctx context.Context, b *box, reason string) {
	// The state first: teardown ends the callers' streams, and they must find it recorded.
	if err := m.setState(ctx, b, StateError, reason); err != nil {
		m.log.Error("mark crashed", "id", b.rec.ID, "err", err)
	}
	_ = m.teardown(ctx, b)
	if err := m.cfg.Store.UpdateSandbox(ctx, b.rec); err != nil { // the slot it gave up
		m.log.Error("record crashed sandbox", "id", b.rec.ID, "err", err)
	}
	m.publish(EventCrashed, b.rec, reason)
}
