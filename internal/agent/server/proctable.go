package server

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/space-sandbox/space/internal/agentpb/process"
	"github.com/space-sandbox/space/internal/errdefs"
)

// procSpec is a validated request to start one process.
type procSpec struct {
	path   string // resolved executable
	argv   []string
	env    []string
	dir    string
	cred   *syscall.Credential // nil: run as the agent's own user
	stdin  bool
	pty    *winsize
	tag    string
	config *pb.ProcessConfig // as requested, for List
}

type winsize struct{ cols, rows uint16 }

// endInfo is how a process ended, as the end event reports it.
type endInfo struct {
	exitCode int
	exited   bool
	status   string
	err      string
}

func endFromStatus(ws unix.WaitStatus) endInfo {
	switch {
	case ws.Exited():
		return endInfo{exitCode: ws.ExitStatus(), exited: true, status: fmt.Sprintf("exit status %d", ws.ExitStatus())}
	case ws.Signaled():
		st := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			st += " (core dumped)"
		}
		return endInfo{exitCode: -1, status: st}
	default:
		return endInfo{exitCode: -1, status: fmt.Sprintf("unknown wait status %#x", uint32(ws))}
	}
}

// proc is one process the agent started. Fields without a comment are set before the proc is
// published and never change.
type proc struct {
	pid     int
	tag     string
	config  *pb.ProcessConfig
	started time.Time
	out     *outputLog
	osProc  *os.Process
	grace   time.Duration

	inMu  sync.Mutex
	stdin *os.File // write end of the stdin pipe; nil if none or closed
	pty   *os.File // PTY master; nil if none or closed

	pipes   []*os.File // read ends the pumps read
	pumps   sync.WaitGroup
	exited  chan struct{}   // closed by the reaper once status is set
	status  unix.WaitStatus // valid after exited is closed
	done    chan struct{}   // closed once end is set and out is closed
	end     endInfo         // valid after done is closed
	hasPTY  bool
	endedAt time.Time // guarded by procTable.mu; zero while running
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// pump copies one output of the process into its log. After the process exited it keeps
// reading only while data keeps coming within the drain grace, so a background grandchild that
// holds the pipe open cannot keep the process "running" forever.
func (p *proc) pump(f *os.File, kind outKind) {
	defer p.pumps.Done()
	buf := make([]byte, 32<<10)
	for {
		select {
		case <-p.exited:
			_ = f.SetReadDeadline(time.Now().Add(p.grace))
		default:
		}
		n, err := f.Read(buf)
		if n > 0 {
			p.out.write(kind, bytes.Clone(buf[:n]), nil)
		}
		if err != nil {
			return // EOF, EIO from a PTY whose slave side is gone, or the drain deadline
		}
	}
}

// finish waits for the exit status and the end of output, then publishes the end.
func (p *proc) finish(t *procTable) {
	<-p.exited
	for _, f := range p.pipes {
		if err := f.SetReadDeadline(time.Now().Add(p.grace)); err != nil {
			// Not pollable: closing is the only way to stop a blocked read.
			time.AfterFunc(p.grace, func() { _ = f.Close() })
		}
	}
	p.pumps.Wait()
	p.inMu.Lock()
	closeAll(p.pipes) // the PTY master is one of them
	if p.stdin != nil {
		_ = p.stdin.Close()
	}
	p.stdin, p.pty = nil, nil
	p.inMu.Unlock()
	p.end = endFromStatus(p.status)
	t.markEnded(p)
	p.out.close()
	close(p.done)
	_ = p.osProc.Release()
}

// procTable knows every process the agent started and not yet forgotten.
type procTable struct {
	cfg *Config

	mu      sync.Mutex
	procs   map[int]*proc // running and finished
	running map[int]*proc // not yet reaped
}

func newProcTable(cfg *Config) *procTable {
	return &procTable{cfg: cfg, procs: map[int]*proc{}, running: map[int]*proc{}}
}

// start starts a process and returns it with a lossless reader of its output, which the
// caller must release.
func (t *procTable) start(spec procSpec) (*proc, *outputReader, error) {
	p := &proc{
		tag: spec.tag, config: spec.config, out: newOutputLog(t.cfg.OutputRetention),
		grace: t.cfg.DrainGrace, exited: make(chan struct{}), done: make(chan struct{}),
		hasPTY: spec.pty != nil,
	}
	childFiles, kinds, err := p.setupIO(spec)
	defer closeAll(childFiles)
	if err != nil {
		closeAll(p.pipes)
		if p.stdin != nil {
			_ = p.stdin.Close()
		}
		return nil, nil, err
	}
	sys := &syscall.SysProcAttr{Credential: spec.cred}
	if spec.pty != nil {
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		sys.Setpgid = true
	}
	attr := &os.ProcAttr{Dir: spec.dir, Env: spec.env, Files: childFiles, Sys: sys}

	// The table lock is held from fork to registration, and the reaper takes it before any
	// wait4, so it cannot collect this child's status before the child is known.
	t.mu.Lock()
	op, err := os.StartProcess(spec.path, spec.argv, attr)
	if err != nil {
		t.mu.Unlock()
		closeAll(p.pipes)
		if p.stdin != nil {
			_ = p.stdin.Close()
		}
		return nil, nil, startError(spec.path, err)
	}
	p.osProc, p.pid, p.started = op, op.Pid, time.Now()
	rd := p.out.reader(true)
	t.procs[p.pid] = p
	t.running[p.pid] = p
	t.mu.Unlock()

	p.pumps.Add(len(p.pipes))
	for i, f := range p.pipes {
		go p.pump(f, kinds[i])
	}
	go p.finish(t)
	t.prune()
	return p, rd, nil
}

// setupIO makes the child's stdio and the agent's ends of it (p.pipes, p.stdin, p.pty).
func (p *proc) setupIO(spec procSpec) (child []*os.File, kinds []outKind, err error) {
	if spec.pty != nil {
		master, slave, err := openPTY()
		if err != nil {
			return nil, nil, fmt.Errorf("open pty: %w", err)
		}
		if err := setWinsize(master, *spec.pty); err != nil {
			_ = master.Close()
			_ = slave.Close()
			return nil, nil, fmt.Errorf("set pty size: %w", err)
		}
		p.pty, p.pipes = master, []*os.File{master}
		return []*os.File{slave, slave, slave}, []outKind{outPTY}, nil
	}
	var in *os.File
	if spec.stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, fmt.Errorf("stdin pipe: %w", err)
		}
		in, p.stdin = r, w
	} else {
		in, err = os.Open(os.DevNull)
		if err != nil {
			return nil, nil, fmt.Errorf("open %s: %w", os.DevNull, err)
		}
	}
	child = []*os.File{in}
	for _, k := range []outKind{outStdout, outStderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return child, nil, fmt.Errorf("output pipe: %w", err)
		}
		child = append(child, w)
		p.pipes = append(p.pipes, r)
		kinds = append(kinds, k)
	}
	return child, kinds, nil
}

func closeAll(fs []*os.File) {
	seen := map[*os.File]bool{}
	for _, f := range fs {
		if f != nil && !seen[f] {
			seen[f] = true
			_ = f.Close()
		}
	}
}

func startError(path string, err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, os.ErrPermission), errors.Is(err, syscall.ENOEXEC),
		errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR):
		return errdefs.InvalidArgument(fmt.Sprintf("start %s: %v", path, err))
	}
	return fmt.Errorf("start %s: %w", path, err)
}

// reap collects exit statuses and hands them to the started processes they belong to. With
// all, it collects every child (orphans re-parented to PID 1 included) and drops statuses of
// processes it did not start; otherwise it waits only for its own processes.
func (t *procTable) reap(all bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	deliver := func(pid int, ws unix.WaitStatus) {
		if p := t.running[pid]; p != nil {
			delete(t.running, pid)
			p.status = ws
			close(p.exited)
		}
	}
	if all {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			deliver(pid, ws)
		}
	}
	for pid := range t.running {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		for err == unix.EINTR {
			wpid, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		switch {
		case wpid == pid:
			deliver(pid, ws)
		case err == unix.ECHILD:
			// Someone else collected it; report an unknown status rather than hang forever.
			deliver(pid, unix.WaitStatus(0x7f00))
		}
	}
}

func (t *procTable) markEnded(p *proc) {
	t.mu.Lock()
	p.endedAt = time.Now()
	t.mu.Unlock()
}

// find returns the process selected by pid or tag (the newest one with that tag).
func (t *procTable) find(sel *pb.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p := t.procs[int(s.Pid)]; p != nil {
			return p, nil
		}
		return nil, errdefs.NotFound(fmt.Sprintf("process with pid %d not found", s.Pid))
	case *pb.ProcessSelector_Tag:
		var best *proc
		for _, p := range t.procs {
			if p.tag == s.Tag && (best == nil || p.started.After(best.started)) {
				best = p
			}
		}
		if best == nil {
			return nil, errdefs.NotFound(fmt.Sprintf("process with tag %q not found", s.Tag))
		}
		return best, nil
	}
	return nil, errdefs.InvalidArgument("process selector needs a pid or a tag")
}

// list returns every known process, oldest first.
func (t *procTable) list() []*proc {
	t.mu.Lock()
	out := make([]*proc, 0, len(t.procs))
	for _, p := range t.procs {
		out = append(out, p)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b *proc) int { return a.started.Compare(b.started) })
	return out
}

// signal sends sig to the process group of a running process.
func (t *procTable) signal(p *proc, sig syscall.Signal) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running[p.pid] == nil {
		return errdefs.NotFound(fmt.Sprintf("process with pid %d is not running", p.pid))
	}
	// The leader is not reaped (we hold the lock the reaper needs), so its pid and process
	// group ID cannot have been reused.
	err := unix.Kill(-p.pid, sig)
	if err == unix.ESRCH { // the leader left its group (setsid, setpgid)
		err = unix.Kill(p.pid, sig)
	}
	if err != nil && err != unix.ESRCH {
		return fmt.Errorf("signal %d: %w", p.pid, err)
	}
	return nil
}

func (t *procTable) signalAll(sig os.Signal) {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for pid := range t.running {
		if unix.Kill(-pid, s) == unix.ESRCH {
			_ = unix.Kill(pid, s)
		}
	}
}

// prune forgets finished processes beyond their TTL or beyond MaxProcesses, and drops the
// output of the oldest finished processes beyond the finished-output budget.
func (t *procTable) prune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ended []*proc
	for _, p := range t.procs {
		if !p.endedAt.IsZero() {
			ended = append(ended, p)
		}
	}
	slices.SortFunc(ended, func(a, b *proc) int { return b.endedAt.Compare(a.endedAt) }) // newest first
	cutoff := time.Now().Add(-t.cfg.ProcessTTL)
	budget := t.cfg.FinishedOutputBudget
	for i, p := range ended {
		if i >= t.cfg.MaxProcesses || p.endedAt.Before(cutoff) {
			delete(t.procs, p.pid)
			continue
		}
		if n := p.out.retained(); n > budget {
			p.out.discard()
			budget = 0
		} else {
			budget -= n
		}
	}
}
