package client

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePausing  = "pausing"
	StatePaused   = "paused"
	StateResuming = "resuming"
	StateDeleting = "deleting"
	StateDeleted  = "deleted"
	StateError    = "error"
)

// Sandbox is a sandbox as the server reports it.
type Sandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Template  string            `json:"template"`
	Runtime   string            `json:"runtime"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at,omitzero"`
	Metadata  map[string]string `json:"metadata"`
	Resources *Resources        `json:"resources,omitempty"`
	Network   *NetworkSpec      `json:"network,omitempty"`
	Parent    *Parent           `json:"parent,omitempty"`
	// AutoSnapshot is set when the sandbox takes automatic snapshots.
	AutoSnapshot *AutoSnapshot `json:"auto_snapshot,omitempty"`
}

// Resources are a sandbox's limits. Zero fields take the server's defaults.
type Resources struct {
	VCPUs     int `json:"vcpus,omitempty"`
	MemoryMiB int `json:"memory_mib,omitempty"`
	DiskMiB   int `json:"disk_mib,omitempty"`
	Pids      int `json:"pids,omitempty"` // processes and threads; 0 is the server's default
}

// NetworkSpec is a sandbox's network policy.
type NetworkSpec struct {
	Egress *Egress `json:"egress,omitempty"`
	// Credentials names secrets (see PUT /v1/secrets) the egress gateway injects for this sandbox.
	Credentials []string `json:"credentials,omitempty"`
}

// Egress is the outbound policy: Default ("deny" or "allow") for hosts that match neither list.
// Entries are host names, optionally with a leading "*." wildcard.
type Egress struct {
	Default string   `json:"default,omitempty"`
	Allow   []string `json:"allow,omitempty"`
	Deny    []string `json:"deny,omitempty"`
	// Passthrough lists TLS names the gateway splices end to end instead of intercepting (for
	// clients that pin certificates; "fronting not checked"). Every other TLS connection is
	// intercepted with the installation CA every sandbox trusts, and a request whose Host is not
	// the TLS server name is refused.
	Passthrough []string `json:"passthrough,omitempty"`
	// Inspect is accepted for compatibility; interception is the default.
	Inspect bool `json:"inspect,omitempty"`
}

// Parent is where a sandbox came from, when it was made from a snapshot or a fork.
type Parent struct {
	SandboxID  string `json:"sandbox_id,omitempty"`
	SnapshotID string `json:"snapshot_id,omitempty"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes. Every field is optional.
type CreateSandboxRequest struct {
	Template       string            `json:"template,omitempty"`
	Runtime        string            `json:"runtime,omitempty"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty"`
	OnTimeout      string            `json:"on_timeout,omitempty"` // "kill" or "pause"
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Resources      *Resources        `json:"resources,omitempty"`
	Network        *NetworkSpec      `json:"network,omitempty"`
	FromSnapshot   string            `json:"from_snapshot,omitempty"`
	AutoSnapshot   *AutoSnapshot     `json:"auto_snapshot,omitempty"`
}

// AutoSnapshot asks for a filesystem snapshot (label "auto") every IntervalSeconds while the
// sandbox runs and its files changed; only the newest Keep (default 5) are kept.
type AutoSnapshot struct {
	IntervalSeconds int `json:"interval_seconds"`
	Keep            int `json:"keep,omitempty"`
}

// ListSandboxesOptions filters ListSandboxes. Empty fields match everything.
type ListSandboxesOptions struct {
	State    string
	Metadata map[string]string // every pair must match
}

// PTYSize is a terminal size in character cells.
type PTYSize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Set exactly one of Cmd (an argv)
// and Command (a shell string run by /bin/sh -c).
type ExecRequest struct {
	Cmd     []string          `json:"cmd,omitempty"`
	Command string            `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	User    string            `json:"user,omitempty"`
	// Stdin, when set, is written to the command's standard input, which is then closed.
	Stdin          *string  `json:"stdin,omitempty"`
	TimeoutSeconds int      `json:"timeout_seconds,omitempty"`
	Background     bool     `json:"background,omitempty"`
	PTY            *PTYSize `json:"pty,omitempty"`
}

// ExecResult is the outcome of a command run to completion. A command killed by its timeout
// exits with 124.
type ExecResult struct {
	PID        int    `json:"pid"`
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMs int64  `json:"duration_ms"`
	// Truncated is set when the server dropped output past its spool limits (ExecStream has
	// none).
	Truncated bool `json:"truncated,omitempty"`
}

// Exec event types, in ExecEvent.Type.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// ExecEvent is one event of a command's stream: "start" (PID), "stdout" or "stderr" (Data),
// "exit" (ExitCode, DurationMs) or "error" (Err). Types this SDK does not know are passed on
// with only Type and Raw set.
type ExecEvent struct {
	Type       string
	PID        int
	Data       []byte
	ExitCode   int
	DurationMs int64
	Err        *Error
	Raw        json.RawMessage // the event's data as sent
}

// Process is a process the sandbox's agent started.
type Process struct {
	PID       int       `json:"pid"`
	Cmd       Argv      `json:"cmd"`
	Running   bool      `json:"running"`
	ExitCode  *int      `json:"exit_code"` // nil while running
	StartedAt time.Time `json:"started_at"`
}

// Argv is a command line. It decodes from a JSON array of strings or from a single string (which
// becomes a one-element Argv), so that either form the server sends is accepted.
type Argv []string

// UnmarshalJSON implements json.Unmarshaler.
func (a *Argv) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*a = Argv{s}
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf("cmd: want a string or a list of strings: %w", err)
	}
	*a = l
	return nil
}

// String joins the argv with spaces, for display.
func (a Argv) String() string { return strings.Join(a, " ") }

// Entry types.
const (
	EntryFile    = "file"
	EntryDir     = "dir"
	EntrySymlink = "symlink"
)

// Entry is one directory entry.
type Entry struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"` // "file", "dir" or "symlink"
	Size       int64     `json:"size"`
	Mode       FileMode  `json:"mode"`
	ModifiedAt time.Time `json:"modified_at"`
}

// FileMode is a Unix permission mode (for example 0o644). It is sent as a JSON number and also
// decodes from an octal string such as "0644".
type FileMode uint32

// UnmarshalJSON implements json.Unmarshaler.
func (m *FileMode) UnmarshalJSON(b []byte) error {
	var n uint32
	if err := json.Unmarshal(b, &n); err == nil {
		*m = FileMode(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("mode: want a number or an octal string: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	if err != nil {
		return fmt.Errorf("mode %q: %w", s, err)
	}
	*m = FileMode(v)
	return nil
}

// String formats the mode in octal, like 0644.
func (m FileMode) String() string { return fmt.Sprintf("%04o", uint32(m)) }

// UploadResult is the answer to Upload.
type UploadResult struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// FileChange is one event of WatchDir: Op is what happened to Path.
type FileChange struct {
	Path string `json:"path"`
	Op   string `json:"op"`
}

// Event is one server event of GET /v1/events: Type is "sandbox.created", "sandbox.deleted",
// "snapshot.created", …; Data is the event's JSON object.
type Event struct {
	Type string
	Data json.RawMessage
}

// Info describes the server.
type Info struct {
	Version        string        `json:"version"`
	Runtimes       []RuntimeInfo `json:"runtimes"`
	DefaultRuntime string        `json:"default_runtime"`
	// Builds are the template builds under way (a first build of base takes minutes).
	Builds []BuildProgress `json:"builds,omitempty"`
}

// BuildProgress is how far along one template build is.
type BuildProgress struct {
	Template  string    `json:"template"`
	Version   string    `json:"version,omitempty"`
	StartedAt time.Time `json:"started_at"`
	Step      string    `json:"step"`  // what it is doing now
	Done      int       `json:"done"`  // units done: packages set up, or steps finished
	Total     int       `json:"total"` // units known so far; 0 when not known yet
}

// RuntimeInfo says whether a sandbox runtime can be used on the server, and if not, why.
type RuntimeInfo struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
}

// APIKey is a newly created API key. Key is the secret; the server shows it only once.
type APIKey struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Tenant string `json:"tenant"`
}
