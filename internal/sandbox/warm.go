package sandbox

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/space-sandbox/space/internal/store"
)

// The warm pools: sandboxes of the default shape (default runtime and resources) of the default
// template and of each template in Config.WarmTemplates, started ahead of demand so that a create
// that fits takes one at once (its template's service, a code interpreter, already started). A pool member is a real
// sandbox with a record under the reserved tenant "" (no API key can have it), kept out of the
// tenants' view; claiming it gives the record to the tenant. Members are removed on Close and by
// Recover, so a stopped spaced leaves none behind.

// warmTenant marks pool members in the store. Tenant names of keys never match it.
const warmTenant = ""

// poolSize is how many members the pool of template keeps ready.
func (m *Manager) poolSize(template string) int {
	if template == m.cfg.DefaultTemplate {
		return m.cfg.WarmPool
	}
	return m.cfg.WarmTemplates[template]
}

// eligible reports whether req can be served from a warm pool.
func (m *Manager) eligible(req CreateRequest) bool {
	r := req.Resources
	tpl := req.Template
	if tpl == "" {
		tpl = m.cfg.DefaultTemplate
	}
	return m.poolSize(tpl) > 0 && req.FromSnapshot == "" &&
		(req.Runtime == "" || req.Runtime == m.cfg.DefaultRuntime) &&
		(r.VCPUs == 0 || r.VCPUs == defaultVCPUs) && (r.MemoryMiB == 0 || r.MemoryMiB == defaultMemoryMiB) &&
		(r.DiskMiB == 0 || r.DiskMiB == defaultDiskMiB) && r.Pids == 0
}

// claim takes a ready pool member and makes it rec's sandbox: rec's ID is replaced by the
// member's (its runtime is named after it). It returns nil if the pool has nothing ready. The
// returned box is locked and registered.
func (m *Manager) claim(ctx context.Context, rec store.Sandbox, spec Spec) *box {
	tpl := rec.Template
	for {
		m.mu.Lock()
		if len(m.warm[tpl]) == 0 {
			m.mu.Unlock()
			m.refill()
			return nil
		}
		b := m.warm[tpl][0]
		m.warm[tpl] = m.warm[tpl][1:]
		m.mu.Unlock()
		m.refill()

		if ctx.Err() != nil { // the caller went away: keep the member for the next one
			m.mu.Lock()
			m.warm[tpl] = append([]*box{b}, m.warm[tpl]...)
			m.mu.Unlock()
			return nil
		}
		// From here the claim completes whatever the caller does.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		b.mu.Lock()
		hctx, hcancel := context.WithTimeout(wctx, 2*time.Second)
		err := b.client.Health(hctx)
		hcancel()
		if err != nil {
			cancel()
			m.log.Warn("warm sandbox unhealthy; discarding", "id", b.rec.ID, "err", err)
			b.mu.Unlock()
			m.goDiscard(b)
			continue
		}
		// The sandbox's variables become the agent's own, as a cold start would have made them:
		// commands may reach the agent directly (the E2B SDK), not only through spaced's exec.
		if len(rec.Env) > 0 {
			if err := b.client.SetEnv(wctx, rec.Env); err != nil {
				cancel()
				m.log.Warn("warm sandbox refused its environment; discarding", "id", b.rec.ID, "err", err)
				b.mu.Unlock()
				m.goDiscard(b)
				continue
			}
		}
		prev := b.rec
		// The member's state (running) carries over: no transition.
		rec.ID, rec.AccessToken, rec.SlotIndex, rec.State = b.rec.ID, b.rec.AccessToken, b.rec.SlotIndex, b.rec.State
		spec.WorkingDir, spec.User, spec.Start, spec.RootFS, spec.Layers = b.spec.WorkingDir, b.spec.User, b.spec.Start, b.spec.RootFS, b.spec.Layers
		rec.Spec = encodeSpec(spec)
		b.rec, b.spec = rec, spec
		err = m.cfg.Store.UpdateSandbox(wctx, b.rec)
		cancel()
		if err != nil {
			b.rec = prev
			b.refresh()
			m.log.Error("claim warm sandbox", "id", prev.ID, "err", err)
			b.mu.Unlock()
			m.goDiscard(b)
			return nil
		}
		b.tenant = rec.Tenant // before it is registered: readable without b.mu from then on
		b.refresh()
		m.register(b)
		return b
	}
}

// refill asks the pool filler to top the pool up.
func (m *Manager) refill() {
	select {
	case m.refillc <- struct{}{}:
	default:
	}
}

// filler keeps every pool's members ready, one start at a time, the emptiest pool first.
func (m *Manager) filler() {
	defer m.wg.Done()
	backoff := time.Second
	for {
		select {
		case <-m.stop:
			return
		case <-m.refillc:
		}
		for {
			tpl, need := m.neediest()
			if !need {
				break
			}
			if err := m.startWarm(tpl); err != nil {
				m.log.Warn("warm pool: start failed", "template", tpl, "err", err, "retry_in", backoff)
				select {
				case <-m.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, time.Minute)
				continue
			}
			backoff = time.Second
		}
	}
}

// neediest is the template whose pool lacks the largest share of its size (the first by name
// among equals); false if every pool is full.
func (m *Manager) neediest() (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sizes := maps.Clone(m.cfg.WarmTemplates)
	if sizes == nil {
		sizes = map[string]int{}
	}
	sizes[m.cfg.DefaultTemplate] = m.cfg.WarmPool
	best, bestFill := "", 1.0
	for _, tpl := range slices.Sorted(maps.Keys(sizes)) {
		if n := sizes[tpl]; n > 0 {
			if fill := float64(len(m.warm[tpl])) / float64(n); fill < bestFill {
				best, bestFill = tpl, fill
			}
		}
	}
	return best, best != ""
}

// startWarm starts one member of template's pool.
func (m *Manager) startWarm(template string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rec, spec, err := m.prepare(ctx, warmTenant, CreateRequest{Template: template})
	if err != nil {
		return err
	}
	rec.ExpiresAt, rec.TimeoutSeconds = time.Time{}, 0
	// The default template may still be building on a first start (minutes): wait for it.
	tctx, tcancel := context.WithTimeout(m.bg, 30*time.Minute)
	tpl, err := m.cfg.Templates(tctx, rec.Template)
	tcancel()
	if err != nil {
		return err
	}
	m.mu.Lock()
	closed := m.closing
	m.mu.Unlock()
	if closed { // shutdown began while the template was built: start nothing
		return errShuttingDown
	}
	if err := m.cfg.Store.CreateSandbox(ctx, rec); err != nil {
		return err
	}
	b := newBox(rec, spec)
	applyTemplate(b, tpl)
	if err := m.holdTemplates(ctx, b.rec.ID, b.spec.RootFS, b.spec.Layers); err != nil {
		_ = m.drop(ctx, b)
		return err
	}
	if err := m.cfg.Store.UpdateSandbox(ctx, b.rec); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := m.start(ctx, b, m.cfg.Drivers[rec.Runtime], tpl); err != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if derr := m.drop(cctx, b); derr != nil {
			m.log.Error("remove record of failed warm sandbox", "id", rec.ID, "err", derr)
		}
		return err
	}
	if err := m.setState(ctx, b, StateRunning, ""); err != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		_ = m.drop(cctx, b)
		return err
	}
	m.mu.Lock()
	closed = m.closing
	if !closed {
		m.warm[template] = append(m.warm[template], b)
	}
	m.mu.Unlock()
	if closed {
		return m.drop(ctx, b)
	}
	m.log.Debug("warm sandbox ready", "id", rec.ID)
	return nil
}

// goDiscard discards b in the background; Close waits for it.
func (m *Manager) goDiscard(b *box) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.discard(b)
	}()
}

// discard removes a pool member that will not be used.
func (m *Manager) discard(b *box) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := m.drop(ctx, b); err != nil {
		m.log.Error("remove warm sandbox", "id", b.rec.ID, "err", err)
	}
}

// drop tears b down and removes its record, for sandboxes no tenant sees (warm pool members,
// build sandboxes, ones a restart caught being made or deleted): one never made goes from
// creating to deleted, any other through deleting. The caller holds b.mu (or owns b alone).
func (m *Manager) drop(ctx context.Context, b *box) error {
	switch State(b.rec.State) {
	case StateCreating, StateDeleting:
	default:
		if err := m.setState(ctx, b, StateDeleting, ""); err != nil {
			return err
		}
	}
	if err := m.teardown(ctx, b); err != nil {
		return err
	}
	return m.setState(ctx, b, StateDeleted, "")
}

// errShuttingDown: Close has begun.
var errShuttingDown = errors.New("spaced is shutting down")

// drainWarm removes pool members (on Close) until deadline; those left are removed by the next
// start's recovery (warm pool members of an earlier run go).
func (m *Manager) drainWarm(deadline time.Time) {
	m.mu.Lock()
	m.closing = true
	var warm []*box
	for _, pool := range m.warm {
		warm = append(warm, pool...)
	}
	m.warm = map[string][]*box{}
	m.mu.Unlock()
	for _, b := range warm {
		if time.Now().After(deadline) {
			return
		}
		m.discard(b)
	}
}

// WarmReady is how many pool members are ready now, of every template.
func (m *Manager) WarmReady() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, pool := range m.warm {
		n += len(pool)
	}
	return n
}
