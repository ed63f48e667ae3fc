package fake

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// gate holds the agent's connections while the sandbox is paused.
type gate struct {
	mu     sync.Mutex
	closed chan struct{} // nil while open; closed when the gate opens again
}

func newGate() *gate { return &gate{} }

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// wait returns once the gate is open, or net.ErrClosed once gone is closed.
func (g *gate) wait(gone <-chan struct{}) error {
	for {
		g.mu.Lock()
		ch := g.closed
		g.mu.Unlock()
		if ch == nil {
			return nil
		}
		select {
		case <-ch:
		case <-gone:
			return net.ErrClosed
		}
	}
}

type gatedListener struct {
	net.Listener
	gate *gate
}

func (l *gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, gate: l.gate, gone: make(chan struct{})}, nil
}

// gatedConn reads and writes only while its gate is open: bytes that arrive while the sandbox
// is paused are handed to the server once it goes on, and answers leave only then.
type gatedConn struct {
	net.Conn
	gate *gate
	once sync.Once
	gone chan struct{}
}

func (c *gatedConn) Read(b []byte) (int, error) {
	if err := c.gate.wait(c.gone); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	if werr := c.gate.wait(c.gone); werr != nil {
		return 0, werr
	}
	return n, err
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if err := c.gate.wait(c.gone); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) Close() error {
	c.once.Do(func() { close(c.gone) })
	return c.Conn.Close()
}

// pause adds a pause to inst; the first one stops it. It fails unless inst runs (or is paused,
// with nested).
func (d *Driver) pause(inst *instance, nested bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case inst.dead:
		return errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s is stopped", inst.spec.ID))
	case inst.paused > 0 && !nested:
		return errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s is paused", inst.spec.ID))
	}
	inst.paused++
	if inst.paused == 1 {
		inst.gate.close()
		inst.srv.SignalAll(syscall.SIGSTOP)
	}
	return nil
}

// resume takes one pause away, all with all; the last one lets inst go on.
func (d *Driver) resume(inst *instance, all bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if inst.dead || inst.paused == 0 {
		return
	}
	inst.paused--
	if all {
		inst.paused = 0
	}
	if inst.paused == 0 {
		inst.srv.SignalAll(syscall.SIGCONT)
		inst.gate.open()
	}
}

// WritableLayer implements runtime.LayerCapturer: <root>/<id>/layer.
func (d *Driver) WritableLayer(id string) (string, error) {
	inst, err := d.lookup("writable layer of", id)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(inst.layer()); err != nil {
		return "", fmt.Errorf("fake: sandbox %s has no writable layer: %w", id, errdefs.ErrNotFound)
	}
	return inst.layer(), nil
}

// Freeze implements runtime.LayerCapturer: the sandbox is paused (StatePaused) while OnPause
// and fn run, then goes on. It must be running.
func (d *Driver) Freeze(ctx context.Context, id string, fn func(dir string) error) error {
	inst, err := d.lookup("freeze", id)
	if err != nil {
		return err
	}
	if err := d.pause(inst, false); err != nil {
		return fmt.Errorf("fake: freeze %s: %w", id, err)
	}
	defer d.resume(inst, false)
	if d.OnPause != nil {
		if err := d.OnPause(ctx, OpFreeze, id); err != nil {
			return fmt.Errorf("fake: freeze %s: %w", id, err)
		}
	}
	return fn(inst.layer())
}

// Pause leaves running sandbox id paused, as a crash of spaced in the middle of a Freeze or a
// checkpoint would (runsc pause, for gVisor). A test control; Thaw ends it.
func (d *Driver) Pause(id string) error {
	inst, err := d.lookup("pause", id)
	if err != nil {
		return err
	}
	if err := d.pause(inst, false); err != nil {
		return fmt.Errorf("fake: pause %s: %w", id, err)
	}
	return nil
}

// Thaw implements runtime.Thawer: a paused sandbox goes on, whatever paused it.
func (d *Driver) Thaw(ctx context.Context, id string) error {
	st, err := d.State(ctx, id)
	if err != nil {
		return err
	}
	if st != runtime.StatePaused {
		return fmt.Errorf("fake: thaw %s: sandbox is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	inst, err := d.lookup("thaw", id)
	if err != nil {
		return err
	}
	d.resume(inst, true)
	return nil
}
