package sandbox

import (
	"sync"
	"time"
)

// Event types published on the event stream (API.md "Events").
const (
	EventCreated   = "sandbox.created"
	EventDeleted   = "sandbox.deleted"
	EventExpired   = "sandbox.expired"
	EventCrashed   = "sandbox.crashed"
	EventRecovered = "sandbox.recovered"
	// EventPauseFailed: an on_timeout pause could not be done; the sandbox runs on and the
	// pause is tried again a minute later (the reason says why it failed).
	EventPauseFailed = "sandbox.pause_failed"
)

// Event is one lifecycle event.
type Event struct {
	Type      string    `json:"type"`
	SandboxID string    `json:"sandbox_id"`
	Tenant    string    `json:"-"`
	Time      time.Time `json:"time"`
	Reason    string    `json:"reason,omitempty"`
}

// broker fans events out to subscribers. A subscriber that does not keep up loses events rather
// than slowing the lifecycle; it sees Dropped grow.
type broker struct {
	mu   sync.Mutex
	subs map[*Subscription]struct{}
}

// Subscription receives events until Close.
type Subscription struct {
	C       <-chan Event
	c       chan Event
	tenant  string
	b       *broker
	mu      sync.Mutex
	dropped int
}

func (b *broker) subscribe(tenant string) *Subscription {
	c := make(chan Event, 256)
	s := &Subscription{C: c, c: c, tenant: tenant, b: b}
	b.mu.Lock()
	if b.subs == nil {
		b.subs = map[*Subscription]struct{}{}
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	return s
}

func (b *broker) publish(e Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		if s.tenant != "" && s.tenant != e.Tenant {
			continue
		}
		select {
		case s.c <- e:
		default:
			s.mu.Lock()
			s.dropped++
			s.mu.Unlock()
		}
	}
}

// Dropped is how many events this subscription lost because it was slow.
func (s *Subscription) Dropped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if _, ok := s.b.subs[s]; ok {
		delete(s.b.subs, s)
		close(s.c)
	}
}
