package sandbox

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/errdefs"
)

// EgressTarget finds the running sandbox whose link address is ip, with its egress policy: the
// gateway asks for every connection and query, so a policy change applies at once.
func (m *Manager) EgressTarget(ip netip.Addr) (egress.Target, bool) {
	for _, b := range m.snapshotBoxes() {
		if a := b.slotAddr.Load(); a != nil && *a == ip {
			v := b.view.Load()
			if v.State != StateRunning {
				continue // a stopped one may still show the address a new sandbox now has
			}
			t, ok := m.target(v.ID, v.Spec.Network.Egress)
			t.Credentials = m.credentials(v.Tenant, v.Spec.Network.Credentials)
			return t, ok
		}
	}
	return egress.Target{}, false
}

func (m *Manager) target(id string, e Egress) (egress.Target, bool) {
	p, err := egress.NewPolicy(e.Default, e.Allow, e.Deny)
	if err != nil { // validated when set; a record from an older version may not parse
		m.log.Warn("egress policy does not parse; denying", "id", id, "err", err)
		p = egress.Policy{Default: "deny"}
	}
	pass, err := egress.ParseRules(e.Passthrough)
	if err != nil {
		m.log.Warn("egress passthrough list does not parse; intercepting all", "id", id, "err", err)
		pass = nil
	}
	return egress.Target{SandboxID: id, Policy: p, Passthrough: pass}, true
}

// UpdateNetwork replaces a sandbox's egress policy; new connections and queries follow it at once.
func (m *Manager) UpdateNetwork(ctx context.Context, tenant, id string, e Egress) (Info, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	if e.Default == "" {
		e.Default = m.cfg.DefaultEgress
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.spec.Network
	n.Egress = e
	if err := validateNetwork(n); err != nil {
		return Info{}, err
	}
	if err := m.checkCredentials(ctx, tenant, n.Credentials); err != nil {
		return Info{}, err
	}
	switch State(b.rec.State) {
	case StateDeleting, StateDeleted:
		return Info{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s", id, b.rec.State))
	}
	old := b.spec
	b.spec.Network = n
	b.rec.Spec = encodeSpec(b.spec)
	if err := m.cfg.Store.UpdateSandbox(ctx, b.rec); err != nil {
		b.spec = old
		b.rec.Spec = encodeSpec(old)
		return Info{}, err
	}
	b.refresh()
	m.log.Info("egress policy changed", "id", id, "default", e.Default, "allow", len(e.Allow), "deny", len(e.Deny))
	return *b.view.Load(), nil
}

// EgressCounts returns the gateway's decisions so far, by decision.
func (m *Manager) EgressCounts() map[string]int64 {
	if m.cfg.Audit == nil {
		return map[string]int64{}
	}
	return m.cfg.Audit.Counts()
}

// EgressEvents returns a sandbox's recent egress decisions.
func (m *Manager) EgressEvents(tenant, id string) ([]egress.Event, error) {
	if _, err := m.lookup(tenant, id); err != nil {
		return nil, err
	}
	if m.cfg.Audit == nil {
		return []egress.Event{}, nil
	}
	return m.cfg.Audit.Events(id), nil
}

// SubscribeEgress streams a sandbox's egress decisions from now on, until cancel.
func (m *Manager) SubscribeEgress(tenant, id string) (<-chan egress.Event, func(), error) {
	if _, err := m.lookup(tenant, id); err != nil {
		return nil, nil, err
	}
	if m.cfg.Audit == nil {
		return nil, nil, errdefs.New(errdefs.ErrFailedPrecondition, "this server has no egress gateway")
	}
	c, cancel := m.cfg.Audit.Subscribe(id)
	return c, cancel, nil
}

// checkCredentials makes sure every credential a sandbox names is one of tenant's secrets.
func (m *Manager) checkCredentials(ctx context.Context, tenant string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	if m.cfg.Credentials == nil {
		return errdefs.InvalidArgument("network.credentials: this server keeps no secrets")
	}
	return m.cfg.Credentials.Check(ctx, tenant, names)
}

// credentials opens the secrets a sandbox names, for the gateway.
func (m *Manager) credentials(tenant string, names []string) []egress.Credential {
	if len(names) == 0 || m.cfg.Credentials == nil {
		return nil
	}
	return m.cfg.Credentials.Open(tenant, names)
}
