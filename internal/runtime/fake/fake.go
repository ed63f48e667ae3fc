// Package fake is a runtime.Driver for unprivileged tests: a "sandbox" is the real agent server
// (agent/server) running in the test process, listening on the slot's guest address (a loopback
// address in tests) at the agent port. Commands it runs are host processes, so tests that use it
// must run harmless commands and use temporary paths. Only tests import it.
package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/agent/server"
	"github.com/space-sandbox/space/internal/runtime"
)

// Driver runs in-process agents. The zero value is not usable; call New.
type Driver struct {
	mu    sync.Mutex
	boxes map[string]*instance
	// FailCreate, if set, makes Create fail for IDs it returns true for.
	FailCreate func(id string) bool
	// Unavailable, if set, is returned by Available.
	Unavailable error
	// Delay, if set, is how long Create takes.
	Delay time.Duration
	// Agent, if set, is served in the agent's place, given the real agent's handler: what a
	// sandbox that replaced its agent with a server of its own answers.
	Agent func(agent http.Handler) http.Handler
}

type instance struct {
	srv    *server.Server
	cancel context.CancelFunc
	done   chan struct{}
	dead   bool
}

// New returns an empty Driver.
func New() *Driver { return &Driver{boxes: map[string]*instance{}} }

// Name implements runtime.Driver.
func (d *Driver) Name() string { return "fake" }

// Available implements runtime.Driver.
func (d *Driver) Available(context.Context) error { return d.Unavailable }

// Create implements runtime.Driver.
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) error {
	if d.Delay > 0 {
		select {
		case <-time.After(d.Delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if d.FailCreate != nil && d.FailCreate(spec.ID) {
		return errors.New("fake: create failed as asked")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.boxes[spec.ID]; ok {
		return fmt.Errorf("fake: %s exists", spec.ID)
	}
	env := []string{"PATH=" + server.DefaultPath}
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	srv, err := server.New(server.Config{Token: spec.AgentToken, BaseEnv: env})
	if err != nil {
		return err
	}
	addr := netip.AddrPortFrom(spec.Network.GuestIP.Addr(), runtime.AgentPort)
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		srv.Close()
		return fmt.Errorf("fake: listen %s: %w", addr, err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	inst := &instance{srv: srv, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(inst.done)
		if d.Agent == nil {
			_ = srv.Serve(sctx, ln)
			return
		}
		hs := &http.Server{Handler: d.Agent(srv.Handler())}
		context.AfterFunc(sctx, func() { hs.Close() })
		_ = hs.Serve(ln)
	}()
	d.boxes[spec.ID] = inst
	return nil
}

// Kill makes a sandbox's runtime die, as a crash would.
func (d *Driver) Kill(id string) {
	d.mu.Lock()
	inst, ok := d.boxes[id]
	d.mu.Unlock()
	if ok {
		inst.stop()
		d.mu.Lock()
		inst.dead = true
		d.mu.Unlock()
	}
}

func (i *instance) stop() {
	i.cancel()
	<-i.done
	i.srv.Close()
}

// State implements runtime.Driver.
func (d *Driver) State(_ context.Context, id string) (runtime.State, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	inst, ok := d.boxes[id]
	switch {
	case !ok:
		return runtime.StateUnknown, nil
	case inst.dead:
		return runtime.StateStopped, nil
	}
	return runtime.StateRunning, nil
}

// Delete implements runtime.Driver.
func (d *Driver) Delete(_ context.Context, id string) error {
	d.mu.Lock()
	inst, ok := d.boxes[id]
	delete(d.boxes, id)
	d.mu.Unlock()
	if ok && !inst.dead {
		inst.srv.SignalAll(syscall.SIGKILL)
		inst.stop()
	}
	return nil
}

// List implements runtime.Driver.
func (d *Driver) List(context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.boxes))
	for id := range d.boxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}
