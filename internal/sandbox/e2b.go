package sandbox

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// AccessToken returns the token a sandbox's agent demands (the E2B API hands it to the SDK,
// which then talks to the agent itself through spaced).
func (m *Manager) AccessToken(tenant, id string) (string, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rec.AccessToken, nil
}

// Connect makes sure a sandbox runs, resuming it if it is paused, and reports whether it did.
func (m *Manager) Connect(ctx context.Context, tenant, id string) (bool, Info, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return false, Info{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	resumed := false
	if State(b.rec.State) == StatePaused {
		if err := m.resume(ctx, b); err != nil {
			return false, Info{}, err
		}
		resumed = true
	}
	if State(b.rec.State) != StateRunning {
		return false, Info{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s", id, b.rec.State))
	}
	return resumed, *b.view.Load(), nil
}

// Envd finds the agent of sandbox id for a caller holding its access token (the E2B SDK's
// direct calls: no API key), resuming the sandbox if it is paused. It returns the agent's base
// URL, the transport to reach it and the sandbox's lifetime.
func (m *Manager) Envd(id, token string) (string, http.RoundTripper, context.Context, error) {
	if !ValidID(id) {
		return "", nil, nil, errdefs.NotFound(fmt.Sprintf("sandbox %q not found", id))
	}
	m.mu.Lock()
	b := m.boxes[id]
	m.mu.Unlock()
	if b == nil || b.tenant == warmTenant {
		return "", nil, nil, errdefs.NotFound(fmt.Sprintf("sandbox %s not found", id))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if subtle.ConstantTimeCompare([]byte(token), []byte(b.rec.AccessToken)) != 1 {
		return "", nil, nil, errdefs.New(errdefs.ErrUnauthenticated, "invalid or missing access token")
	}
	if State(b.rec.State) == StatePaused {
		if err := m.resume(context.Background(), b); err != nil {
			return "", nil, nil, err
		}
	}
	if State(b.rec.State) != StateRunning || b.client == nil || b.slot == nil {
		return "", nil, nil, errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s is %s", id, b.rec.State))
	}
	return m.cfg.AgentURL(b.slot), b.hc.Transport, b.life, nil
}

// PortTarget is where a request for a port of a sandbox goes.
type PortTarget struct {
	URL          string // http://<guest ip>:<port>
	Transport    http.RoundTripper
	Life         context.Context
	Tenant       string
	TrafficToken string
	AccessToken  string
}

// PortSecrets are the sandbox's tokens a port route may demand: its traffic token ("" if it has
// none) and its access token.
type PortSecrets struct{ TrafficToken, AccessToken string }

// Port finds a port of sandbox id for forwarding (resuming it if paused). With tenant set, the
// sandbox must be that tenant's. authorize, if set, is called with the sandbox's tokens before
// anything touches the sandbox: an error from it is returned and a paused sandbox stays paused
// (the unauthenticated host-name route must not resume a sandbox for a caller without its
// token).
func (m *Manager) Port(tenant, id string, port int, authorize func(PortSecrets) error) (PortTarget, error) {
	if port < 1 || port > 65535 {
		return PortTarget{}, errdefs.InvalidArgument(fmt.Sprintf("port %d: want 1..65535", port))
	}
	if !ValidID(id) {
		return PortTarget{}, errdefs.NotFound(fmt.Sprintf("sandbox %q not found", id))
	}
	m.mu.Lock()
	b := m.boxes[id]
	m.mu.Unlock()
	if b == nil || b.tenant == warmTenant || (tenant != "" && b.tenant != tenant) {
		return PortTarget{}, errdefs.NotFound(fmt.Sprintf("sandbox %s not found", id))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if authorize != nil {
		if err := authorize(PortSecrets{TrafficToken: b.spec.TrafficToken, AccessToken: b.rec.AccessToken}); err != nil {
			return PortTarget{}, err
		}
	}
	if State(b.rec.State) == StatePaused {
		if err := m.resume(context.Background(), b); err != nil {
			return PortTarget{}, err
		}
	}
	if State(b.rec.State) != StateRunning || b.slot == nil {
		return PortTarget{}, errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s is %s", id, b.rec.State))
	}
	return PortTarget{
		URL: fmt.Sprintf("http://%s", netip.AddrPortFrom(b.slot.GuestIP.Addr(), uint16(port))), Transport: b.hc.Transport,
		Life: b.life, Tenant: b.tenant, TrafficToken: b.spec.TrafficToken, AccessToken: b.rec.AccessToken,
	}, nil
}

// Service finds the port of the template's service (see Service) of tenant's sandbox id, as
// Port does; a sandbox whose template has none gives errdefs.ErrFailedPrecondition.
func (m *Manager) Service(tenant, id string) (PortTarget, error) {
	if !ValidID(id) {
		return PortTarget{}, errdefs.NotFound(fmt.Sprintf("sandbox %q not found", id))
	}
	m.mu.Lock()
	b := m.boxes[id]
	m.mu.Unlock()
	if b == nil || b.tenant == warmTenant || b.tenant != tenant {
		return PortTarget{}, errdefs.NotFound(fmt.Sprintf("sandbox %s not found", id))
	}
	b.mu.Lock()
	svc, tpl := b.spec.Start, b.rec.Template
	b.mu.Unlock()
	if svc == nil {
		return PortTarget{}, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s (template %s) runs no code interpreter: create it from template code-interpreter", id, tpl))
	}
	return m.Port(tenant, id, svc.ReadyPort, nil)
}

// TrafficToken returns the token guarding a sandbox's ports ("" if it has none).
func (m *Manager) TrafficToken(tenant, id string) (string, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.spec.TrafficToken, nil
}

// Usage reports a running sandbox's resource use and limits.
func (m *Manager) Usage(ctx context.Context, tenant, id string) (runtime.Usage, Resources, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return runtime.Usage{}, Resources{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.rec.State) != StateRunning {
		return runtime.Usage{}, b.spec.Resources, nil // a paused sandbox uses nothing but disk
	}
	ur, ok := m.cfg.Drivers[b.rec.Runtime].(runtime.UsageReporter)
	if !ok {
		return runtime.Usage{}, b.spec.Resources, errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("runtime %s reports no usage", b.rec.Runtime))
	}
	u, err := ur.Usage(ctx, id)
	return u, b.spec.Resources, err
}
