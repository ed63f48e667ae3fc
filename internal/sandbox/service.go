package sandbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/errdefs"
)

// serviceTag names the template's service in the agent's process table.
const serviceTag = "space-service"

// startService starts the template's service in b through its agent and waits until it is ready
// or ctx ends. The caller holds b.mu and b's agent answers.
func (m *Manager) startService(ctx context.Context, b *box, svc Service) error {
	t0 := time.Now()
	// No deadline reaches the agent: the service outlives this call (closing the stream only
	// detaches from it).
	st, err := b.client.Start(context.WithoutCancel(ctx), agent.ExecRequest{
		Argv: svc.Command, Env: svc.Env, Cwd: svc.WorkingDir, User: svc.User, Tag: serviceTag,
	})
	if err != nil {
		return fmt.Errorf("start the template's service %v: %w", svc.Command, err)
	}
	st.Close()
	if err := m.waitService(ctx, b, svc); err != nil {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("the template's service %v did not become ready: %v", svc.Command, err))
	}
	m.log.Debug("service ready", "id", b.rec.ID, "took", time.Since(t0))
	return nil
}

// waitService polls the service's ready check until it answers 200 or ctx ends.
func (m *Manager) waitService(ctx context.Context, b *box, svc Service) error {
	url := fmt.Sprintf("http://%s%s", netip.AddrPortFrom(b.slot.GuestIP.Addr(), uint16(svc.ReadyPort)), svc.ReadyPath)
	var last error
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		last = probeHTTP(ctx, b.hc, url)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", context.Cause(ctx), last)
		case <-time.After(wait):
		}
	}
}

// probeHTTP GETs url once, with at most a second for the answer.
func probeHTTP(ctx context.Context, hc *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(res.Body, 4096))
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", url, res.Status)
	}
	return nil
}
