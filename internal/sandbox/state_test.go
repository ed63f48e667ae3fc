package sandbox

import (
	"errors"
	"testing"

	"github.com/space-sandbox/space/internal/errdefs"
)

func TestTransitions(t *testing.T) {
	tests := []struct {
		from, to State
		ok       bool
	}{
		{StateCreating, StateRunning, true},
		{StateCreating, StatePaused, false},
		{StateRunning, StateDeleting, true},
		{StateRunning, StateCreating, false},
		{StatePaused, StateResuming, true},
		{StatePaused, StateRunning, false},
		{StateDeleting, StateDeleted, true},
		{StateDeleted, StateRunning, false},
		{StateDeleted, StateDeleting, false},
		{StateError, StateDeleting, true},
		{StateError, StateRunning, false},
		{StateCreating, StateDeleted, true},
		{StateCreating, StateError, false},
		{StatePausing, StateResuming, true},
	}
	for _, tt := range tests {
		err := checkTransition(tt.from, tt.to)
		if (err == nil) != tt.ok {
			t.Errorf("%s → %s: err %v, want ok=%v", tt.from, tt.to, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s → %s: error class %v", tt.from, tt.to, err)
		}
	}
	// Every state is in the table, and every target is a state.
	for from, tos := range transitions {
		for _, to := range tos {
			if _, ok := transitions[to]; !ok {
				t.Errorf("%s → %s: unknown target", from, to)
			}
		}
	}
	for _, s := range []string{"creating", "running", "pausing", "paused", "resuming", "deleting", "deleted", "error"} {
		if !ValidState(s) {
			t.Errorf("%s missing from the table", s)
		}
	}
}

func TestIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newID("sbx_", 20)
		if !ValidID(id) || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
	for _, bad := range []string{"", "sbx_", "sbx_ABCDEFGHIJKLMNOPQRST", "../sbx_aaaaaaaaaaaaaaaaaaaa", "sbx_aaaaaaaaaaaaaaaaaaaa/x"} {
		if ValidID(bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
	if h := hostname("sbx_abcdefghij0123456789"); h != "sbx-abcdefghij0123456789" {
		t.Errorf("hostname %q", h)
	}
}
