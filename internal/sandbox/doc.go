// Package sandbox is the lifecycle of SPACE sandboxes: the state machine (one transition table and
// one guard), create and delete, timeouts and the reaper, crash detection, re-adoption after a
// restart of spaced, command execution through the agent, the event stream, and the orchestration
// of snapshots, restores and forks (their content is internal/snapshot's). It is the only
// writer of sandbox state. It drives the store, a runtime driver, the network slot pool and the
// template source through small interfaces; the API layer calls it and never touches those.
package sandbox
