package snapshot

import "github.com/space-sandbox/space/internal/store"

// Automatic snapshots (a sandbox's auto_snapshot).
const (
	MinAutoInterval = 2 // seconds
	DefaultAutoKeep = 5
	// AutoLabel labels automatic snapshots; the oldest of them beyond Keep are deleted.
	AutoLabel = "auto"
)

// Prune returns the automatic snapshots of list (one sandbox's, oldest first) beyond the
// newest keep: those to delete, oldest first.
func Prune(list []store.Snapshot, keep int) []store.Snapshot {
	var autos []store.Snapshot
	for _, s := range list {
		if s.Label == AutoLabel {
			autos = append(autos, s)
		}
	}
	keep = max(keep, 0)
	if len(autos) <= keep {
		return nil
	}
	return autos[:len(autos)-keep]
}
