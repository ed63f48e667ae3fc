package egress

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound what one sandbox may make the gateway hold, so that no sandbox can exhaust
// spaced's descriptors or its resolver: connections open at once and opened per second, DNS
// queries per second, and how long a connection may stay silent both ways. Zero fields take the
// defaults (DefaultLimits).
type Limits struct {
	MaxConns    int           // concurrent TCP connections per sandbox
	ConnRate    float64       // new connections per second per sandbox (sustained)
	ConnBurst   int           // new connections at once, above the rate
	DNSRate     float64       // DNS queries per second per sandbox (sustained)
	DNSBurst    int           // queries at once, above the rate
	IdleTimeout time.Duration // a connection silent both ways this long is closed
	// MaxTotalConns bounds the connections of all sandboxes together: each costs spaced two
	// descriptors (the sandbox's and the upstream's).
	MaxTotalConns int
}

// DefaultLimits are the limits of a gateway started without any.
var DefaultLimits = Limits{
	MaxConns: 256, ConnRate: 100, ConnBurst: 200, DNSRate: 50, DNSBurst: 100,
	IdleTimeout: 5 * time.Minute, MaxTotalConns: 4096,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	set(&d.MaxConns, l.MaxConns)
	set(&d.ConnRate, l.ConnRate)
	set(&d.ConnBurst, l.ConnBurst)
	set(&d.DNSRate, l.DNSRate)
	set(&d.DNSBurst, l.DNSBurst)
	set(&d.IdleTimeout, l.IdleTimeout)
	set(&d.MaxTotalConns, l.MaxTotalConns)
	return d
}

// set replaces *dst by v when v is set (positive).
func set[T int | float64 | time.Duration](dst *T, v T) {
	if v > 0 {
		*dst = v
	}
}

// bucket is a token bucket: rate tokens a second, up to burst.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *bucket) take(now time.Time, rate float64, burst int) bool {
	if b.last.IsZero() {
		b.tokens = float64(burst)
	} else {
		b.tokens = min(float64(burst), b.tokens+now.Sub(b.last).Seconds()*rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// usage is one sandbox's share of the gateway.
type usage struct {
	conns     int
	newConns  bucket
	dns       bucket
	lastAudit time.Time // of a refusal by a limit: one event a second, not one per attempt
}

// limiter counts connections and queries per sandbox.
type limiter struct {
	lim   Limits
	total atomic.Int64
	mu    sync.Mutex
	by    map[string]*usage
}

func newLimiter(l Limits) *limiter { return &limiter{lim: l.withDefaults(), by: map[string]*usage{}} }

func (l *limiter) get(id string) *usage {
	u := l.by[id]
	if u == nil {
		u = &usage{}
		l.by[id] = u
	}
	return u
}

// conn admits a new connection of sandbox id; release must be called when it ends. The reason
// is "" when admitted; audit says whether this refusal should be recorded (rate-limited).
func (l *limiter) conn(id string) (release func(), reason string, audit bool) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.get(id)
	switch {
	case u.conns >= l.lim.MaxConns:
		reason = "too many open connections (limit " + itoa(l.lim.MaxConns) + ")"
	case !u.newConns.take(now, l.lim.ConnRate, l.lim.ConnBurst):
		reason = "too many new connections per second (limit " + itoa(int(l.lim.ConnRate)) + ")"
	}
	if reason != "" {
		audit = now.Sub(u.lastAudit) >= time.Second
		if audit {
			u.lastAudit = now
		}
		return nil, reason, audit
	}
	u.conns++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			u.conns--
			if u.conns == 0 && time.Since(u.newConns.last) > time.Minute && time.Since(u.dns.last) > time.Minute {
				delete(l.by, id)
			}
			l.mu.Unlock()
		})
	}, "", false
}

// query admits a DNS query of sandbox id.
func (l *limiter) query(id string) (ok, audit bool) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.get(id)
	if u.dns.take(now, l.lim.DNSRate, l.lim.DNSBurst) {
		return true, false
	}
	audit = now.Sub(u.lastAudit) >= time.Second
	if audit {
		u.lastAudit = now
	}
	return false, audit
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// idleConn is a sandbox's connection that remembers when it last moved bytes either way; the
// gateway's janitor closes it after Limits.IdleTimeout of silence, whatever is relaying it
// (splice, HTTP, HTTP/2, a WebSocket).
type idleConn struct {
	net.Conn
	last atomic.Int64 // unix nanoseconds
}

func newIdleConn(c net.Conn) *idleConn {
	ic := &idleConn{Conn: c}
	ic.last.Store(time.Now().UnixNano())
	return ic
}

func (c *idleConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.last.Store(time.Now().UnixNano())
	}
	return n, err
}

func (c *idleConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// CloseWrite half-closes the underlying connection when it can.
func (c *idleConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
