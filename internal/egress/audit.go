package egress

import (
	"sync"
	"time"
)

// Event is one egress decision.
type Event struct {
	Time      time.Time `json:"time"`
	SandboxID string    `json:"-"`
	Host      string    `json:"host"`
	IP        string    `json:"ip"`
	Port      int       `json:"port"`
	Proto     string    `json:"proto"` // tcp, dns
	Decision  string    `json:"decision"`
	Reason    string    `json:"reason"`
}

// auditKeep is how many recent events are kept per sandbox.
const auditKeep = 1000

// Audit keeps recent decisions per sandbox and fans them out to subscribers. The zero value is
// not usable; use NewAudit.
type Audit struct {
	mu     sync.Mutex
	recent map[string][]Event
	subs   map[string]map[chan Event]struct{}
	counts map[string]int64 // by decision
}

// NewAudit returns an empty audit log.
func NewAudit() *Audit {
	return &Audit{recent: map[string][]Event{}, subs: map[string]map[chan Event]struct{}{}, counts: map[string]int64{}}
}

// Record adds ev.
func (a *Audit) Record(ev Event) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := append(a.recent[ev.SandboxID], ev)
	if len(l) > auditKeep {
		l = l[len(l)-auditKeep:]
	}
	a.recent[ev.SandboxID] = l
	a.counts[ev.Decision]++
	for c := range a.subs[ev.SandboxID] {
		select {
		case c <- ev:
		default: // a slow reader loses events rather than slowing the gateway
		}
	}
}

// Events returns the recent events of a sandbox, oldest first.
func (a *Audit) Events(id string) []Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Event(nil), a.recent[id]...)
}

// Subscribe returns a channel of a sandbox's new events and a function that ends it.
func (a *Audit) Subscribe(id string) (<-chan Event, func()) {
	c := make(chan Event, 256)
	a.mu.Lock()
	if a.subs[id] == nil {
		a.subs[id] = map[chan Event]struct{}{}
	}
	a.subs[id][c] = struct{}{}
	a.mu.Unlock()
	return c, func() {
		a.mu.Lock()
		delete(a.subs[id], c)
		if len(a.subs[id]) == 0 {
			delete(a.subs, id)
		}
		a.mu.Unlock()
	}
}

// Forget drops a sandbox's events (when it is deleted).
func (a *Audit) Forget(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.recent, id)
}

// Counts returns the number of decisions so far, by decision.
func (a *Audit) Counts() map[string]int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int64, len(a.counts))
	for k, v := range a.counts {
		out[k] = v
	}
	return out
}
