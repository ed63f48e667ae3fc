package sandbox

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"

	"github.com/space-sandbox/space/internal/errdefs"
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
