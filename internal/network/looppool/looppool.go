// Package looppool is a sandbox.SlotPool for unprivileged tests: each slot's guest address is
// a loopback address (127.a.b.n, a and b random per pool, so that parallel tests do not
// collide), where runtime/fake's in-process agents listen. It makes no namespace, link or rule.
// Only tests import it.
package looppool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/network"
)

// Pool hands out up to 254 loopback slots. The zero value is not usable; call New.
type Pool struct {
	mu          sync.Mutex
	a, b        byte
	inUse       map[int]bool
	failRelease bool
}

// New returns an empty Pool.
func New() *Pool {
	return &Pool{a: byte(rand.IntN(200) + 20), b: byte(rand.IntN(250)), inUse: map[int]bool{}}
}

func (p *Pool) slot(i int) *network.Slot {
	guest := netip.AddrFrom4([4]byte{127, p.a, p.b, byte(i)})
	return &network.Slot{Index: i, NetNS: fmt.Sprintf("loop-%d", i), GuestIf: "lo", HostIP: guest, GuestIP: netip.PrefixFrom(guest, 32)}
}

// Acquire implements sandbox.SlotPool.
func (p *Pool) Acquire(context.Context) (*network.Slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 1; i < 255; i++ {
		if !p.inUse[i] {
			p.inUse[i] = true
			return p.slot(i), nil
		}
	}
	return nil, errdefs.New(errdefs.ErrResourceExhausted, "no slots")
}

// Adopt implements sandbox.SlotPool.
func (p *Pool) Adopt(_ context.Context, i int) (*network.Slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.inUse[i] {
		return nil, errdefs.NotFound("slot gone")
	}
	return p.slot(i), nil
}

// Release implements sandbox.SlotPool; it fails while SetFailRelease(true) is in force.
func (p *Pool) Release(_ context.Context, s *network.Slot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failRelease {
		return errors.New("loop pool: release fails as asked")
	}
	delete(p.inUse, s.Index)
	return nil
}

// InUse implements sandbox.SlotPool.
func (p *Pool) InUse() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for i := range p.inUse {
		out = append(out, i)
	}
	return out
}

// SetFailRelease makes Release fail (true) or work again (false).
func (p *Pool) SetFailRelease(v bool) {
	p.mu.Lock()
	p.failRelease = v
	p.mu.Unlock()
}
