package egress

import (
	"testing"
	"time"
)

// TestLimitsDefaults: zero fields take the defaults, set ones are kept.
func TestLimitsDefaults(t *testing.T) {
	if got := (Limits{}).withDefaults(); got != DefaultLimits {
		t.Fatalf("zero limits: %+v", got)
	}
	l := Limits{MaxConns: 3, ConnRate: 1.5, DNSBurst: 7, IdleTimeout: time.Second}
	got := l.withDefaults()
	want := DefaultLimits
	want.MaxConns, want.ConnRate, want.DNSBurst, want.IdleTimeout = 3, 1.5, 7, time.Second
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
