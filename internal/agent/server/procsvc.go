package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	pb "github.com/space-sandbox/space/internal/agentpb/process"
	"github.com/space-sandbox/space/internal/agentpb/process/processconnect"
	"github.com/space-sandbox/space/internal/errdefs"
)

// processService implements process.Process.
type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

// Start runs a process and streams start, output and end. The stream is lossless: a slow reader
// slows the process down (its writes block) instead of losing output. If the request has a
// deadline (Connect-Timeout-Ms), the process group is killed when it passes, whether or not the
// client is still connected; without one, a client that goes away merely detaches: the process
// keeps running and can be reattached with Connect.
func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	spec, err := ps.s.buildSpec(userFrom(ctx), req.Msg)
	if err != nil {
		return connectErr(err)
	}
	p, rd, err := ps.s.procs.start(spec)
	if err != nil {
		return connectErr(err)
	}
	defer rd.release()
	ps.s.log.Debug("process started", "pid", p.pid, "cmd", spec.path)
	if dl, ok := ctx.Deadline(); ok {
		// The deadline bounds the process's life, not just this stream: a client that times
		// out usually hangs up a moment before the agent's own timer fires.
		kill := time.AfterFunc(time.Until(dl), func() {
			ps.s.log.Debug("process deadline passed, killing", "pid", p.pid)
			_ = ps.s.procs.signal(p, syscall.SIGKILL)
		})
		go func() { <-p.done; kill.Stop() }()
	}
	return ps.s.streamProcess(ctx, req.Header(), p, rd, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

// Connect replays the retained output of a process, follows it live and ends with its end
// event (at once for a process that already finished). A reader that falls more than the
// retained window (Config.OutputRetention) behind the process skips the output it missed.
func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return connectErr(err)
	}
	rd := p.out.reader(false)
	err = ps.s.streamProcess(ctx, req.Header(), p, rd, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
	if rd.skipped > 0 {
		ps.s.log.Debug("connect reader fell behind the retained output", "pid", p.pid, "chunks_skipped", rd.skipped)
	}
	return err
}

func (s *Server) streamProcess(ctx context.Context, h http.Header, p *proc, rd *outputReader, send func(*pb.ProcessEvent) error) error {
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}); err != nil {
		return err
	}
	interval := keepaliveInterval(h, s.cfg.Keepalive)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		c, err := rd.next(ctx, timer.C)
		switch {
		case err == nil:
			if err := send(dataEvent(c)); err != nil {
				return err
			}
		case errors.Is(err, errIdle):
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case errors.Is(err, io.EOF):
			<-p.done
			return send(endEvent(p.end))
		default:
			return connectErr(err)
		}
		timer.Reset(interval)
	}
}

func dataEvent(c chunk) *pb.ProcessEvent {
	d := &pb.ProcessEvent_DataEvent{}
	switch c.kind {
	case outStdout:
		d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: c.data}
	case outStderr:
		d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: c.data}
	default:
		d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: c.data}
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}
}

func endEvent(e endInfo) *pb.ProcessEvent {
	end := &pb.ProcessEvent_EndEvent{ExitCode: int32(e.exitCode), Exited: e.exited, Status: e.status}
	if e.err != "" {
		end.Error = &e.err
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
}

// keepaliveInterval reads the Keepalive-Ping-Interval header (seconds).
func keepaliveInterval(h http.Header, def time.Duration) time.Duration {
	if v := h.Get(keepaliveHeader); v != "" {
		if n, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && n > 0 && n < 86400 {
			return time.Duration(n * float64(time.Second))
		}
	}
	return def
}

func (ps *processService) List(ctx context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	resp := &pb.ListResponse{}
	for _, p := range ps.s.procs.list() {
		info := &pb.ProcessInfo{Config: p.config, Pid: uint32(p.pid), StartedAtUnixMs: p.started.UnixMilli()}
		if p.tag != "" {
			info.Tag = &p.tag
		}
		if p.running() {
			info.Running = true
		} else {
			code := int32(p.end.exitCode)
			info.ExitCode = &code
		}
		resp.Processes = append(resp.Processes, info)
	}
	return connect.NewResponse(resp), nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, connectErr(err)
	}
	if err := p.writeInput(ctx, req.Msg.GetInput()); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// StreamInput takes a start event naming the process, then input events, in order.
func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.s.procs.find(ev.Start.GetProcess())
			if err != nil {
				return nil, connectErr(err)
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("input before start event"))
			}
			if err := p.writeInput(ctx, ev.Data.GetInput()); err != nil {
				return nil, connectErr(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// writeInput writes to the stdin pipe or the PTY of p, honouring ctx's deadline.
func (p *proc) writeInput(ctx context.Context, in *pb.ProcessInput) error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	var f *os.File
	var data []byte
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		if p.hasPTY {
			f = p.pty // E2B clients may send stdin to a PTY process; it is the same terminal
		} else {
			f = p.stdin
		}
		data = v.Stdin
	case *pb.ProcessInput_Pty:
		if !p.hasPTY {
			return errdefs.Conflict(fmt.Sprintf("process %d has no pty", p.pid))
		}
		f, data = p.pty, v.Pty
	default:
		return errdefs.InvalidArgument("input needs stdin or pty data")
	}
	if f == nil {
		if !p.running() {
			return errdefs.Conflict(fmt.Sprintf("process %d has exited", p.pid))
		}
		return errdefs.Conflict(fmt.Sprintf("process %d has no open stdin (start it with stdin: true)", p.pid))
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = f.SetWriteDeadline(dl)
		defer func() { _ = f.SetWriteDeadline(time.Time{}) }()
	}
	if _, err := f.Write(data); err != nil {
		if errors.Is(err, syscall.EPIPE) {
			return errdefs.Conflict(fmt.Sprintf("process %d closed its input", p.pid))
		}
		return fmt.Errorf("write input of %d: %w", p.pid, err)
	}
	return nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, connectErr(err)
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.hasPTY {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has a pty; send ^D (0x04) instead", p.pid))
	}
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, connectErr(err)
	}
	sig := syscall.Signal(req.Msg.GetSignalNumber())
	if sig == 0 {
		sig = syscall.Signal(req.Msg.GetSignal())
	}
	if sig <= 0 || sig > 64 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid signal %d", sig))
	}
	if err := ps.s.procs.signal(p, sig); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (ps *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, connectErr(err)
	}
	size := req.Msg.GetPty().GetSize()
	if size == nil {
		return connect.NewResponse(&pb.UpdateResponse{}), nil
	}
	ws, err := toWinsize(size)
	if err != nil {
		return nil, connectErr(err)
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if !p.hasPTY {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no pty", p.pid))
	}
	if p.pty == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has exited", p.pid))
	}
	if err := setWinsize(p.pty, ws); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("resize pty: %w", err))
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

func toWinsize(s *pb.PTY_Size) (winsize, error) {
	if s.GetCols() == 0 || s.GetRows() == 0 || s.GetCols() > 0xffff || s.GetRows() > 0xffff {
		return winsize{}, errdefs.InvalidArgument(fmt.Sprintf("invalid pty size %dx%d", s.GetCols(), s.GetRows()))
	}
	return winsize{cols: uint16(s.GetCols()), rows: uint16(s.GetRows())}, nil
}

// buildSpec validates a StartRequest and resolves everything the process needs.
func (s *Server) buildSpec(u User, req *pb.StartRequest) (procSpec, error) {
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return procSpec{}, errdefs.InvalidArgument("process.cmd is required")
	}
	spec := procSpec{stdin: req.GetStdin(), tag: req.GetTag(), config: cfg}
	if req.Pty != nil {
		ws := winsize{cols: 80, rows: 24}
		if sz := req.GetPty().GetSize(); sz != nil {
			var err error
			if ws, err = toWinsize(sz); err != nil {
				return procSpec{}, err
			}
		}
		spec.pty = &ws
	}
	dir, err := s.workDir(u, cfg)
	if err != nil {
		return procSpec{}, err
	}
	spec.dir = dir
	spec.env = buildEnv(s.baseEnv(), u, cfg.GetEnvs(), spec.pty != nil)
	spec.path, err = lookPath(cfg.GetCmd(), envValue(spec.env, "PATH"), dir)
	if err != nil {
		return procSpec{}, err
	}
	spec.argv = append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	if u.UID != uint32(os.Geteuid()) || u.GID != uint32(os.Getegid()) {
		spec.cred = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	return spec, nil
}

// workDir is the requested cwd (relative to home) or the user's home ("/" if it is missing).
func (s *Server) workDir(u User, cfg *pb.ProcessConfig) (string, error) {
	if cfg.Cwd == nil || cfg.GetCwd() == "" {
		if fi, err := os.Stat(u.Home); err == nil && fi.IsDir() {
			return u.Home, nil
		}
		return "/", nil
	}
	dir, err := resolvePath(u, cfg.GetCwd())
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return "", errdefs.InvalidArgument(fmt.Sprintf("cwd %s: %v", dir, errors.Unwrap(err)))
	}
	if !fi.IsDir() {
		return "", errdefs.InvalidArgument(fmt.Sprintf("cwd %s is not a directory", dir))
	}
	return dir, nil
}

// buildEnv lays the user's identity, a default PATH (and TERM for a PTY) and then the request's
// variables over the base environment. Later entries win; order is stable.
func buildEnv(base []string, u User, req map[string]string, pty bool) []string {
	var keys []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			set(k, v)
		}
	}
	set("HOME", u.Home)
	set("USER", u.Name)
	set("LOGNAME", u.Name)
	if _, ok := vals["PATH"]; !ok {
		set("PATH", DefaultPath)
	}
	if _, ok := vals["TERM"]; pty && !ok {
		set("TERM", "xterm-256color")
	}
	reqKeys := make([]string, 0, len(req))
	for k := range req {
		reqKeys = append(reqKeys, k)
	}
	slices.Sort(reqKeys)
	for _, k := range reqKeys {
		if k != "" && !strings.ContainsAny(k, "=\x00") {
			set(k, req[k])
		}
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+vals[k])
	}
	return out
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath finds name the way a shell would, in the child's PATH rather than the agent's.
// A name with a slash is used as is (relative names resolve against dir in the child).
func lookPath(name, path, dir string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errdefs.InvalidArgument(fmt.Sprintf("exec: %q: executable file not found in $PATH", name))
}
