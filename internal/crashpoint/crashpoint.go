// Package crashpoint is the fault-injection hook of the crash-point tests. A spaced configured
// with a point's name (SPACE_CRASH_AT, a test-only setting read by internal/config) kills itself
// with SIGKILL when an operation reaches that point, as a power cut, an OOM kill or a supervisor
// would, so that a test can restart it on the same home and check that nothing acknowledged was
// lost and nothing was left stranded. The points are the named steps below; each is reached in
// one place. Imported by the packages that define steps and by cmd/spaced; a nil *Hook does
// nothing, which is what every production configuration has.
package crashpoint

import (
	"log/slog"
	"os"
	"slices"
	"syscall"
)

// The steps. Names are "<operation>.<step>"; the step says what has happened when it is reached.
const (
	CreateRecorded  = "create.recorded"  // record stored as creating, nothing started
	CreateStarted   = "create.started"   // runtime started, state not yet running
	PausePausing    = "pause.pausing"    // state pausing recorded, checkpoint not begun
	PauseCheckpoint = "pause.checkpoint" // checkpoint written, not yet marked complete
	PauseMarked     = "pause.marked"     // checkpoint complete and marked, runtime still there
	PauseStopped    = "pause.stopped"    // runtime removed, state not yet paused
	ResumeResuming  = "resume.resuming"  // state resuming recorded, runtime not restored
	ResumeRestored  = "resume.restored"  // runtime restored from the checkpoint, not yet running
	ResumeRunning   = "resume.running"   // state running recorded, checkpoint not yet removed
	ForkCheckpoint  = "fork.checkpoint"  // parent's checkpoint taken (parent running again)
	ForkCopy        = "fork.copy"        // a copy restored, not yet running
	SnapFrozen      = "snapshot.frozen"  // file snapshot: sandbox frozen for its final pass
	SnapFullFrozen  = "snapshot.full"    // full snapshot: checkpoint taken into scratch, not stored
	SnapStored      = "snapshot.stored"  // content in the chunk store, record not yet written
	RestorePaths    = "restore.paths"    // restore by paths: request to the agent begun, no file sent
	RestoreWhole    = "restore.whole"    // whole restore: old runtime stopped, new not started
	DeleteDeleting  = "delete.deleting"  // state deleting recorded, runtime still there
	DeleteTornDown  = "delete.torn-down" // runtime and slot gone, record still there
	BuildStarted    = "build.started"    // template build: build sandbox running
	BuildLayer      = "build.layer"      // template build: layer exported, template not recorded
	RecoverAdopting = "recover.adopting" // recovery: one sandbox re-adopted, others not yet
)

// All lists every step, for tests that visit each.
func All() []string {
	return []string{CreateRecorded, CreateStarted, PausePausing, PauseCheckpoint, PauseMarked, PauseStopped,
		ResumeResuming, ResumeRestored, ResumeRunning, ForkCheckpoint, ForkCopy, SnapFrozen, SnapFullFrozen,
		SnapStored, RestorePaths, RestoreWhole, DeleteDeleting, DeleteTornDown, BuildStarted, BuildLayer,
		RecoverAdopting}
}

// Hook kills the process at one step. The zero of *Hook (nil) never does.
type Hook struct {
	at  string
	log *slog.Logger
}

// New returns a hook for step at, or nil if at is empty. An unknown step is an error in the
// caller's configuration: Valid tells.
func New(at string, log *slog.Logger) *Hook {
	if at == "" {
		return nil
	}
	if log == nil {
		log = slog.Default()
	}
	return &Hook{at: at, log: log}
}

// Valid reports whether name is one of the steps.
func Valid(name string) bool { return slices.Contains(All(), name) }

// At is called when an operation reaches step. If the hook is set to that step the process
// dies at once with SIGKILL: no deferred function runs, no file is closed, nothing is flushed.
func (h *Hook) At(step string) {
	if h == nil || h.at != step {
		return
	}
	h.log.Warn("crash point reached: killing spaced", "point", step)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late; never go on past the point
}
