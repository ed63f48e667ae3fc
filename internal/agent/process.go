package agent

import (
	"context"
	"fmt"
	"io"
	"slices"
	"syscall"
	"time"

	pb "github.com/space-sandbox/space/internal/agentpb/process"
	"github.com/space-sandbox/space/internal/errdefs"
)

// ExecRequest describes a process to start in the sandbox.
type ExecRequest struct {
	Argv  []string          // Argv[0] is looked up in the process's PATH unless it has a slash
	Env   map[string]string // laid over the agent's environment
	Cwd   string            // default: the user's home; a missing directory is ErrInvalidArgument
	User  string            // default: the agent's default user (root)
	Tag   string            // optional name to Connect by
	Stdin bool              // keep stdin open for SendStdin / CloseStdin (else /dev/null)
	PTY   *PTYSize          // run on a pseudo-terminal of this size; output arrives as EventPTY
}

// PTYSize is a terminal size in character cells.
type PTYSize struct{ Cols, Rows uint16 }

// EventKind says what an Event carries.
type EventKind int

const (
	EventStart  EventKind = iota + 1 // PID
	EventStdout                      // Data
	EventStderr                      // Data
	EventPTY                         // Data
	EventEnd                         // ExitCode, Exited, Status, Error
)

func (k EventKind) String() string {
	switch k {
	case EventStart:
		return "start"
	case EventStdout:
		return "stdout"
	case EventStderr:
		return "stderr"
	case EventPTY:
		return "pty"
	case EventEnd:
		return "end"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one message of a process stream. A process killed by a signal ends with
// ExitCode -1, Exited false and a Status such as "signal: killed".
type Event struct {
	Kind     EventKind
	PID      uint32
	Data     []byte
	ExitCode int
	Exited   bool
	Status   string
	Error    string
}

// ProcessStream is the event stream of one process. Recv is not safe for concurrent use; Close
// may be called from any goroutine.
type ProcessStream struct {
	pid    uint32
	recv   func() (*pb.ProcessEvent, error)
	close  func() error
	cancel context.CancelFunc
	ended  bool
}

// Start starts a process and returns its stream with the start event consumed. The stream is
// lossless: if it is read slowly, the process is slowed down, never cut. If ctx has a deadline
// it is sent to the agent, which kills the process group when it passes; cancelling ctx (or
// closing the stream) without a deadline only detaches: the process keeps running.
func (c *Client) Start(ctx context.Context, req ExecRequest) (*ProcessStream, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, errdefs.InvalidArgument("exec: empty argv")
	}
	msg := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: req.Argv[0], Args: req.Argv[1:], Envs: req.Env}}
	if req.Cwd != "" {
		msg.Process.Cwd = &req.Cwd
	}
	if req.Tag != "" {
		msg.Tag = &req.Tag
	}
	if req.Stdin {
		msg.Stdin = &req.Stdin
	}
	if req.PTY != nil {
		msg.Pty = &pb.PTY{Size: &pb.PTY_Size{Cols: uint32(req.PTY.Cols), Rows: uint32(req.PTY.Rows)}}
	}
	sctx, cancel := context.WithCancel(ctx)
	st, err := c.proc.Start(sctx, newRequest(c, msg, req.User))
	if err != nil {
		cancel()
		return nil, rpcError(err)
	}
	return openStream(cancel, st.Close, func() (*pb.ProcessEvent, error) {
		if !st.Receive() {
			return nil, st.Err()
		}
		return st.Msg().GetEvent(), nil
	})
}

// Connect attaches to a running or finished process: the retained output (up to the agent's
// retention window) is replayed, then live output follows, then the end event. A reader that
// falls more than the window behind misses the output in between.
func (c *Client) Connect(ctx context.Context, pid uint32) (*ProcessStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	st, err := c.proc.Connect(sctx, newRequest(c, &pb.ConnectRequest{Process: pidSel(pid)}, ""))
	if err != nil {
		cancel()
		return nil, rpcError(err)
	}
	return openStream(cancel, st.Close, func() (*pb.ProcessEvent, error) {
		if !st.Receive() {
			return nil, st.Err()
		}
		return st.Msg().GetEvent(), nil
	})
}

func openStream(cancel context.CancelFunc, closeFn func() error, recv func() (*pb.ProcessEvent, error)) (*ProcessStream, error) {
	s := &ProcessStream{recv: recv, close: closeFn, cancel: cancel}
	for {
		ev, err := recv()
		if err != nil {
			_ = s.Close()
			return nil, rpcError(err)
		}
		if ev == nil {
			_ = s.Close()
			return nil, errdefs.New(errdefs.ErrUnavailable, "agent: process stream ended before its start event")
		}
		if ev.GetKeepalive() != nil {
			continue
		}
		start := ev.GetStart()
		if start == nil {
			_ = s.Close()
			return nil, fmt.Errorf("agent: expected start event, got %T: %w", ev.GetEvent(), errdefs.ErrUnavailable)
		}
		s.pid = start.GetPid()
		return s, nil
	}
}

// PID is the process ID from the start event.
func (s *ProcessStream) PID() uint32 { return s.pid }

// Recv returns the next event, skipping keepalives. After the end event it returns io.EOF; a
// stream that breaks before the end event returns an error of class ErrUnavailable.
func (s *ProcessStream) Recv() (Event, error) {
	if s.ended {
		return Event{}, io.EOF
	}
	for {
		ev, err := s.recv()
		if err != nil {
			s.ended = true
			return Event{}, rpcError(err)
		}
		if ev == nil {
			s.ended = true
			return Event{}, errdefs.New(errdefs.ErrUnavailable, "agent: process stream ended without an end event")
		}
		switch e := ev.GetEvent().(type) {
		case *pb.ProcessEvent_Keepalive:
			continue
		case *pb.ProcessEvent_Start:
			return Event{Kind: EventStart, PID: e.Start.GetPid()}, nil
		case *pb.ProcessEvent_Data:
			switch d := e.Data.GetOutput().(type) {
			case *pb.ProcessEvent_DataEvent_Stdout:
				return Event{Kind: EventStdout, PID: s.pid, Data: d.Stdout}, nil
			case *pb.ProcessEvent_DataEvent_Stderr:
				return Event{Kind: EventStderr, PID: s.pid, Data: d.Stderr}, nil
			case *pb.ProcessEvent_DataEvent_Pty:
				return Event{Kind: EventPTY, PID: s.pid, Data: d.Pty}, nil
			}
		case *pb.ProcessEvent_End:
			s.ended = true
			end := e.End
			return Event{Kind: EventEnd, PID: s.pid, ExitCode: int(end.GetExitCode()), Exited: end.GetExited(),
				Status: end.GetStatus(), Error: end.GetError()}, nil
		}
	}
}

// Close releases the stream. Without a deadline on the stream's context this only detaches
// from the process.
func (s *ProcessStream) Close() error {
	s.cancel()
	return s.close()
}

func pidSel(pid uint32) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
}

// SendStdin writes data to the stdin of a process started with Stdin (or to its PTY).
func (c *Client) SendStdin(ctx context.Context, pid uint32, data []byte) error {
	msg := &pb.SendInputRequest{Process: pidSel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: data}}}
	_, err := c.proc.SendInput(ctx, newRequest(c, msg, ""))
	return rpcError(err)
}

// SendPTY writes data to the terminal of a PTY process.
func (c *Client) SendPTY(ctx context.Context, pid uint32, data []byte) error {
	msg := &pb.SendInputRequest{Process: pidSel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: data}}}
	_, err := c.proc.SendInput(ctx, newRequest(c, msg, ""))
	return rpcError(err)
}

// CloseStdin closes the stdin of a process started with Stdin, so it reads EOF.
func (c *Client) CloseStdin(ctx context.Context, pid uint32) error {
	_, err := c.proc.CloseStdin(ctx, newRequest(c, &pb.CloseStdinRequest{Process: pidSel(pid)}, ""))
	return rpcError(err)
}

// Signal sends sig to the process group of a running process (ErrNotFound if it is not running).
func (c *Client) Signal(ctx context.Context, pid uint32, sig syscall.Signal) error {
	msg := &pb.SendSignalRequest{Process: pidSel(pid), SignalNumber: uint32(sig)}
	switch sig {
	case syscall.SIGKILL:
		msg.Signal = pb.Signal_SIGNAL_SIGKILL
	case syscall.SIGTERM:
		msg.Signal = pb.Signal_SIGNAL_SIGTERM
	}
	_, err := c.proc.SendSignal(ctx, newRequest(c, msg, ""))
	return rpcError(err)
}

// Resize changes the terminal size of a PTY process.
func (c *Client) Resize(ctx context.Context, pid uint32, size PTYSize) error {
	msg := &pb.UpdateRequest{Process: pidSel(pid),
		Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: uint32(size.Cols), Rows: uint32(size.Rows)}}}
	_, err := c.proc.Update(ctx, newRequest(c, msg, ""))
	return rpcError(err)
}

// ProcessInfo describes a process the agent knows (running, or finished recently).
type ProcessInfo struct {
	PID       uint32
	Argv      []string
	Tag       string
	Running   bool
	ExitCode  *int // nil while running
	StartedAt time.Time
}

// Processes lists the processes the agent knows, oldest first.
func (c *Client) Processes(ctx context.Context) ([]ProcessInfo, error) {
	resp, err := c.proc.List(ctx, newRequest(c, &pb.ListRequest{}, ""))
	if err != nil {
		return nil, rpcError(err)
	}
	var out []ProcessInfo
	for _, p := range resp.Msg.GetProcesses() {
		info := ProcessInfo{
			PID:       p.GetPid(),
			Argv:      append([]string{p.GetConfig().GetCmd()}, slices.Clone(p.GetConfig().GetArgs())...),
			Tag:       p.GetTag(),
			Running:   p.GetRunning(),
			StartedAt: time.UnixMilli(p.GetStartedAtUnixMs()),
		}
		if p.ExitCode != nil {
			code := int(p.GetExitCode())
			info.ExitCode = &code
		}
		out = append(out, info)
	}
	return out, nil
}
