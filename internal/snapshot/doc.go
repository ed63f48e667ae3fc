// Package snapshot is the content side of SPACE snapshots: the manifest that describes one (the
// chunk store root of its ID), capturing trees into the chunk store, reading manifests back,
// lineage and diff, per-tenant stored_bytes accounting, reconciling snapshot records with the
// chunk store at start, and writing a snapshot's trees back out (a tar for a restore by paths,
// layers and the runtime's image for a whole restore). It knows nothing of sandbox state, locks
// or runtimes: internal/sandbox imports it and does the orchestration (locking, freezing,
// checkpoints, state changes, crash points); internal/api and internal/e2b use its API types.
package snapshot
