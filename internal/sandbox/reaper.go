package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"

	"github.com/space-sandbox/space/internal/runtime"
)

// pauseRetry is how long a sandbox whose on_timeout pause failed runs on before the next try.
const pauseRetry = time.Minute

// reaper removes (or pauses) expired sandboxes and notices runtimes that died. The work on each
// sandbox runs on its own (m.background): one slow sandbox never holds up the others.
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
		now := m.cfg.Now()
		for _, b := range m.expired(now) {
			m.background("expire", b.id, func(ctx context.Context) { m.expire(ctx, b) })
		}
		if now.Sub(lastHealth) >= m.cfg.HealthInterval {
			lastHealth = now
			m.checkHealth()
		}
	}
}

// expire ends b's time: removed, or paused if it asked for that. A pause that fails leaves it
// running: an event says why and the pause is tried again after pauseRetry.
func (m *Manager) expire(ctx context.Context, b *box) {
	if b.view.Load().OnTimeout != "pause" {
		if err := m.remove(ctx, b, EventExpired, "timeout"); err != nil {
			m.log.Error("remove expired sandbox", "id", b.id, "err", err)
		}
		return
	}
	_, err := m.Pause(ctx, b.tenant, b.id)
	if err == nil {
		return
	}
	m.log.Error("pause expired sandbox", "id", b.id, "err", err)
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.rec.State) != StateRunning {
		return
	}
	prev := b.rec
	b.rec.ExpiresAt = m.cfg.Now().UTC().Add(pauseRetry)
	if uerr := m.cfg.Store.UpdateSandbox(ctx, b.rec); uerr != nil {
		b.rec = prev
		m.log.Error("record the retry of a failed pause", "id", b.id, "err", uerr)
	}
	b.refresh()
	m.publish(EventPauseFailed, b.rec, fmt.Sprintf("on_timeout pause failed (retried in %s): %v", pauseRetry, err))
}

// background runs fn for sandbox id in its own goroutine, at most one job of a kind per sandbox
// and at most backgroundJobs at once; it returns false (and runs nothing) when that job is still
// running or every worker is busy: the caller's next round tries again.
func (m *Manager) background(kind, id string, fn func(ctx context.Context)) bool {
	key := kind + "/" + id
	m.mu.Lock()
	if m.closing || m.busy[key] || len(m.busy) >= m.cfg.BackgroundJobs {
		m.mu.Unlock()
		return false
	}
	m.busy[key] = true
	m.wg.Add(1) // under mu: Close sets closing under it before it waits
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.busy, key)
			m.mu.Unlock()
		}()
		fn(context.Background())
	}()
	return true
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

// checkHealth looks at every running sandbox's runtime: cheaply (runtime.Prober) where the
// driver can, each sandbox in its own background job. One whose runtime is gone is brought back
// from its latest full snapshot or marked crashed, and its resources are freed.
func (m *Manager) checkHealth() {
	for _, b := range m.snapshotBoxes() {
		if b.view.Load().State != StateRunning {
			continue
		}
		if p, ok := m.cfg.Drivers[b.view.Load().Runtime].(runtime.Prober); ok && p.Alive(context.Background(), b.id) {
			continue
		}
		m.background("health", b.id, func(ctx context.Context) { m.checkOne(ctx, b) })
	}
}

// checkOne confirms with the driver's State that b's runtime is gone, and handles it.
func (m *Manager) checkOne(ctx context.Context, b *box) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.rec.State) != StateRunning {
		return
	}
	st, err := m.cfg.Drivers[b.rec.Runtime].State(ctx, b.rec.ID)
	if err == nil && st != runtime.StateRunning {
		m.log.Warn("sandbox runtime died", "id", b.rec.ID, "state", st)
		if !m.recoverFromSnapshot(ctx, b, "runtime is "+string(st)) {
			m.crashed(ctx, b, "runtime is "+string(st))
		}
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
