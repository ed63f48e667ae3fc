package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/errdefs"
)

// TimeoutExitCode is the exit code reported for a command killed by its timeout.
const TimeoutExitCode = 124

// ExecOptions is a command to run in a sandbox.
type ExecOptions struct {
	Argv       []string
	Env        map[string]string
	Cwd        string
	User       string
	Stdin      *string // written to the command's stdin, then closed
	Timeout    time.Duration
	Background bool
	PTY        *agent.PTYSize
}

// ExecEventKind says what an ExecEvent carries.
type ExecEventKind int

// Kinds of ExecEvent.
const (
	ExecStdout ExecEventKind = iota + 1
	ExecStderr
	ExecExit
)

// ExecEvent is one piece of a running command's life.
type ExecEvent struct {
	Kind     ExecEventKind
	Data     []byte
	ExitCode int
	Duration time.Duration
}

// Execution is a command's event stream. Next returns io.EOF after the exit event.
type Execution struct {
	pid     uint32
	stream  *agent.ProcessStream
	ctx     context.Context
	cancel  context.CancelFunc
	started time.Time
	timeout bool      // a timeout was set; reaching it means exit 124
	dl      time.Time // the deadline when timeout is set
	done    bool
	probe   func() error // checks the sandbox after a broken stream; non-nil: it stopped
}

// timeoutGrace is how long a timed command's stream outlives its timeout, for the kill to land
// and the last output to arrive.
const timeoutGrace = 5 * time.Second

// deadlineSlack covers the agent enforcing the same deadline a moment before our clock does.
const deadlineSlack = 250 * time.Millisecond

// timedOut reports whether the command's timeout has (all but) passed.
func (e *Execution) timedOut() bool {
	return e.timeout && (errors.Is(e.ctx.Err(), context.DeadlineExceeded) || !time.Now().Before(e.dl.Add(-deadlineSlack)))
}

// PID is the command's process ID inside the sandbox.
func (e *Execution) PID() uint32 { return e.pid }

// Next returns the next event.
func (e *Execution) Next() (ExecEvent, error) {
	if e.done {
		return ExecEvent{}, io.EOF
	}
	for {
		ev, err := e.stream.Recv()
		if err != nil {
			if e.timedOut() {
				e.done = true
				return ExecEvent{Kind: ExecExit, ExitCode: TimeoutExitCode, Duration: time.Since(e.started)}, nil
			}
			if cause := stopped(e.ctx); cause != nil {
				e.done = true
				return ExecEvent{}, cause
			}
			if e.probe != nil && e.ctx.Err() == nil { // the stream broke, not our side: is the sandbox alive?
				if cause := e.probe(); cause != nil {
					e.done = true
					return ExecEvent{}, cause
				}
			}
			if errors.Is(err, io.EOF) {
				e.done = true
				return ExecEvent{}, errdefs.New(errdefs.ErrUnavailable, "command stream ended without an exit status")
			}
			return ExecEvent{}, err
		}
		switch ev.Kind {
		case agent.EventStdout, agent.EventPTY:
			return ExecEvent{Kind: ExecStdout, Data: ev.Data}, nil
		case agent.EventStderr:
			return ExecEvent{Kind: ExecStderr, Data: ev.Data}, nil
		case agent.EventEnd:
			e.done = true
			code := exitCode(ev)
			if code == 128+int(syscall.SIGKILL) && e.timedOut() {
				code = TimeoutExitCode // killed by the agent for its deadline
			}
			return ExecEvent{Kind: ExecExit, ExitCode: code, Duration: time.Since(e.started)}, nil
		}
	}
}

// Close releases the stream. A command still running keeps running.
func (e *Execution) Close() error {
	e.cancel()
	if e.stream == nil {
		return nil
	}
	return e.stream.Close()
}

// exitCode turns an agent end event into a shell-style exit code: 128+n for death by signal n.
func exitCode(ev agent.Event) int {
	if ev.Exited || !strings.HasPrefix(ev.Status, "signal: ") {
		return ev.ExitCode
	}
	name := strings.TrimPrefix(ev.Status, "signal: ")
	for n := syscall.Signal(1); n < 65; n++ {
		if n.String() == name {
			return 128 + int(n)
		}
	}
	return ev.ExitCode
}

// client returns the agent client of a running sandbox of tenant and the context of its life.
func (m *Manager) client(tenant, id string) (*agent.Client, context.Context, error) {
	c, life, _, _, err := m.clientFor(tenant, id)
	return c, life, err
}

// clientFor is client plus what a command needs of the sandbox: a copy of its own environment
// (commands get it under their own: a sandbox taken from the warm pool started before it was
// known) and its spec (the template's command defaults).
func (m *Manager) clientFor(tenant, id string) (*agent.Client, context.Context, map[string]string, Spec, error) {
	b, err := m.lookup(tenant, id)
	if err != nil {
		return nil, nil, nil, Spec{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.rec.State) == StatePaused { // using a paused sandbox resumes it
		if err := m.resume(context.Background(), b); err != nil {
			return nil, nil, nil, Spec{}, err
		}
	}
	if State(b.rec.State) != StateRunning || b.client == nil {
		return nil, nil, nil, Spec{}, errdefs.Conflict(fmt.Sprintf("sandbox %s is %s, not running", id, b.rec.State))
	}
	env := make(map[string]string, len(b.rec.Env))
	for k, v := range b.rec.Env {
		env[k] = v
	}
	return b.client, b.life, env, b.spec, nil
}

// startFailed explains a command that could not be started: a sandbox that stopped meanwhile (a
// pause, a delete or a crash racing the start) is said to be unavailable, in its state, rather
// than passing on the broken connection.
func (m *Manager) startFailed(ctx context.Context, tenant, id string, err error) error {
	if serr := stopped(ctx); serr != nil {
		return serr
	}
	b, lerr := m.lookup(tenant, id)
	if lerr != nil {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s went away while the command was being started", id))
	}
	if st := b.view.Load().State; st != StateRunning {
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s is %s: the command was not started", id, st))
	}
	return err
}

// Agent returns the agent client of a running sandbox, for file operations, and a context that
// is ctx ended also when the sandbox stops. Call release when done.
func (m *Manager) Agent(ctx context.Context, tenant, id string) (c *agent.Client, actx context.Context, release func(), err error) {
	c, life, err := m.client(tenant, id)
	if err != nil {
		return nil, nil, nil, err
	}
	actx, cancel := withLife(ctx, life)
	return c, actx, cancel, nil
}

// withLife returns ctx, also cancelled (with the sandbox's cause) when life ends.
func withLife(ctx, life context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	return cctx, func() { stop(); cancel(context.Canceled) }
}

// stopped returns the cause if ctx ended because the sandbox stopped.
func stopped(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && errors.Is(cause, errdefs.ErrUnavailable) {
		return cause
	}
	return nil
}

// Exec starts a command. For a background command the returned Execution has only a PID: call
// Close at once. Otherwise read events with Next until io.EOF, then Close.
func (m *Manager) Exec(ctx context.Context, tenant, id string, o ExecOptions) (*Execution, error) {
	if len(o.Argv) == 0 || o.Argv[0] == "" {
		return nil, errdefs.InvalidArgument("exec: empty command")
	}
	if err := validateMap("env", o.Env, envKeyRE); err != nil {
		return nil, err
	}
	if o.Timeout < 0 {
		return nil, errdefs.InvalidArgument("timeout_seconds: must not be negative")
	}
	c, life, env, defaults, err := m.clientFor(tenant, id)
	if err != nil {
		return nil, err
	}
	if o.Cwd == "" {
		o.Cwd = defaults.WorkingDir
	}
	if o.User == "" {
		o.User = defaults.User
	}
	for k, v := range o.Env {
		env[k] = v
	}
	req := agent.ExecRequest{Argv: o.Argv, Env: env, Cwd: o.Cwd, User: o.User, PTY: o.PTY,
		Stdin: o.Stdin != nil || o.Background || o.PTY != nil}
	// Foreground commands follow the request; background ones outlive it.
	base := ctx
	if o.Background {
		base = context.WithoutCancel(ctx)
	}
	// With a timeout, spaced kills the command at the deadline and reads on to its end, so no
	// output written before the kill is lost; the stream itself (and the agent's own deadline
	// kill, a fallback) runs timeoutGrace longer.
	lctx, lcancel := withLife(base, life)
	sctx, tcancel := context.WithCancel(lctx)
	if o.Timeout > 0 {
		sctx, tcancel = context.WithTimeout(lctx, o.Timeout+timeoutGrace)
	}
	var killer *time.Timer
	cancel := func() {
		if killer != nil {
			killer.Stop()
		}
		tcancel()
		lcancel()
	}
	started := time.Now()
	stream, err := c.Start(sctx, req)
	if err != nil {
		cancel()
		return nil, m.startFailed(sctx, tenant, id, err)
	}
	if o.Timeout > 0 {
		pid := stream.PID()
		killer = time.AfterFunc(time.Until(started.Add(o.Timeout)), func() {
			kctx, kcancel := context.WithTimeout(context.WithoutCancel(lctx), 5*time.Second)
			defer kcancel()
			if err := c.Signal(kctx, pid, syscall.SIGKILL); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				m.log.Warn("kill command at its timeout", "id", id, "pid", pid, "err", err)
			}
		})
	}
	e := &Execution{pid: stream.PID(), stream: stream, ctx: sctx, cancel: cancel, started: started, timeout: o.Timeout > 0, dl: started.Add(o.Timeout),
		probe: func() error { return m.probe(tenant, id) }}
	if o.Stdin != nil {
		if len(*o.Stdin) > 0 {
			if err := c.SendStdin(ctx, e.pid, []byte(*o.Stdin)); err != nil {
				e.Close()
				return nil, fmt.Errorf("write stdin: %w", err)
			}
		}
		if err := c.CloseStdin(ctx, e.pid); err != nil {
			e.Close()
			return nil, fmt.Errorf("close stdin: %w", err)
		}
	}
	if o.Background && o.Timeout > 0 {
		// Hold the stream so that the agent's deadline kills the command on time.
		go func() {
			defer e.Close()
			for {
				if _, err := e.Next(); err != nil {
					return
				}
				if e.done {
					return
				}
			}
		}()
		return &Execution{pid: e.pid, ctx: sctx, cancel: func() {}, done: true}, nil
	}
	return e, nil
}

// Attach follows a process's output from its start (as far as the agent kept it), then live.
func (m *Manager) Attach(ctx context.Context, tenant, id string, pid uint32) (*Execution, error) {
	c, life, err := m.client(tenant, id)
	if err != nil {
		return nil, err
	}
	sctx, cancel := withLife(ctx, life)
	stream, err := c.Connect(sctx, pid)
	if err != nil {
		cancel()
		return nil, err
	}
	return &Execution{pid: pid, stream: stream, ctx: sctx, cancel: cancel, started: time.Now(),
		probe: func() error { return m.probe(tenant, id) }}, nil
}

// Processes lists the sandbox's processes started through the agent.
func (m *Manager) Processes(ctx context.Context, tenant, id string) ([]agent.ProcessInfo, error) {
	c, _, err := m.client(tenant, id)
	if err != nil {
		return nil, err
	}
	return c.Processes(ctx)
}

// Stdin writes data to a process's stdin and, if eof, closes it.
func (m *Manager) Stdin(ctx context.Context, tenant, id string, pid uint32, r io.Reader, eof bool) error {
	c, _, err := m.client(tenant, id)
	if err != nil {
		return err
	}
	buf := make([]byte, 32<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := c.SendStdin(ctx, pid, buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read stdin body: %w", rerr)
		}
	}
	if eof {
		return c.CloseStdin(ctx, pid)
	}
	return nil
}

// Signal sends sig to a process (and its process group).
func (m *Manager) Signal(ctx context.Context, tenant, id string, pid uint32, sig syscall.Signal) error {
	c, _, err := m.client(tenant, id)
	if err != nil {
		return err
	}
	return c.Signal(ctx, pid, sig)
}

// Resize changes a PTY process's terminal size.
func (m *Manager) Resize(ctx context.Context, tenant, id string, pid uint32, size agent.PTYSize) error {
	if size.Cols == 0 || size.Rows == 0 {
		return errdefs.InvalidArgument("resize: cols and rows must be positive")
	}
	c, _, err := m.client(tenant, id)
	if err != nil {
		return err
	}
	return c.Resize(ctx, pid, size)
}
