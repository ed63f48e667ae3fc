package sandbox

import (
	"fmt"

	"github.com/space-sandbox/space/internal/errdefs"
)

// State is a sandbox's lifecycle state as the API shows it.
type State string

// The lifecycle states (API.md "Sandboxes").
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePausing  State = "pausing"
	StatePaused   State = "paused"
	StateResuming State = "resuming"
	StateDeleting State = "deleting"
	StateDeleted  State = "deleted"
	StateError    State = "error"
)

// transitions is the lifecycle's one transition table: from → allowed next states.
var transitions = map[State][]State{
	StateCreating: {StateRunning, StateError, StateDeleting},
	StateRunning:  {StatePausing, StateResuming, StateDeleting, StateError}, // resuming: a restore
	StatePausing:  {StatePaused, StateRunning, StateError},
	StatePaused:   {StateResuming, StateDeleting},
	StateResuming: {StateRunning, StateError, StatePaused},
	StateDeleting: {StateDeleted, StateError},
	StateError:    {StateDeleting, StateResuming}, // resuming: a restore or a recovery
	StateDeleted:  nil,
}

// ValidState reports whether s names a lifecycle state.
func ValidState(s string) bool {
	_, ok := transitions[State(s)]
	return ok
}

// checkTransition is the one guard every state change goes through.
func checkTransition(from, to State) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return errdefs.Conflict(fmt.Sprintf("sandbox is %s; cannot become %s", from, to))
}
