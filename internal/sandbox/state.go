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

// transitions is the lifecycle's one transition table: from → allowed next states. Every state
// write goes through setState, which checks it here. New records start in creating (prepare,
// forkOne, createFromSnapshot); nothing else sets a state. Why each edge exists:
//
//	creating → running   a create, a fork copy, a create from a snapshot or a warm pool member
//	                     whose agent answered
//	creating → deleted   one whose making failed is removed with its record at once (abandon,
//	                     drop): nobody was told it exists; also a build sandbox (which never
//	                     runs for tenants) and a create a restart of spaced interrupted (adopt)
//	running  → pausing   Pause starts its checkpoint
//	running  → resuming  a whole Restore, or recovery from the latest full snapshot of a
//	                     sandbox whose runtime died (checkHealth, probe, adopt)
//	running  → deleting  Delete, expiry, the removal of a warm pool member
//	running  → error     its runtime died (crashed)
//	pausing  → paused    the checkpoint is durable and the runtime gone (Pause), or a restart
//	                     found a checkpoint of an interrupted pause (adopt)
//	pausing  → running   the checkpoint failed and the runtime still runs (Pause), or a restart
//	                     found the runtime of an interrupted pause running (adopt)
//	pausing  → resuming  a restart found the runtime of an interrupted pause dead and no
//	                     checkpoint: recovery from its latest full snapshot (adopt)
//	pausing  → error     the checkpoint failed and took the runtime with it, or was not durable,
//	                     or could not be recorded (Pause); dead and unrecoverable after a restart
//	paused   → resuming  Resume (and every use that resumes: exec, files, ports, connect), a
//	                     whole Restore
//	paused   → deleting  Delete
//	resuming → running   the agent answered (resume, Restore, recovery, adopt)
//	resuming → paused    the restore of a checkpoint failed or its agent did not answer: the
//	                     checkpoint is intact (resume), or a restart found the checkpoint of an
//	                     interrupted resume (adopt)
//	resuming → error     a whole Restore or a recovery from a snapshot failed after the old
//	                     runtime was stopped, or a resumed sandbox could not be recorded
//	deleting → deleted   its runtime, slot and checkpoint are gone; the record goes (remove,
//	                     drop, adopt)
//	deleting → error     tearing it down failed: a later Delete retries
//	error    → deleting  Delete
//	error    → resuming  a whole Restore from a snapshot
//
// deleted is the end: the record is gone (setState persists it by deleting the record).
var transitions = map[State][]State{
	StateCreating: {StateRunning, StateDeleted},
	StateRunning:  {StatePausing, StateResuming, StateDeleting, StateError},
	StatePausing:  {StatePaused, StateRunning, StateResuming, StateError},
	StatePaused:   {StateResuming, StateDeleting},
	StateResuming: {StateRunning, StatePaused, StateError},
	StateDeleting: {StateDeleted, StateError},
	StateError:    {StateDeleting, StateResuming},
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
