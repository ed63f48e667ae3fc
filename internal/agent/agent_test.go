package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/server"
	"github.com/space-sandbox/space/internal/errdefs"
)

const testToken = "s3cret-token"

type testAgent struct {
	c    *agent.Client
	url  string
	home string
	etc  string
	srv  *server.Server
}

// startAgent runs an agent in-process on 127.0.0.1:0 with a private user database whose root
// is the test's own uid (so no credential switch is needed) and whose home is a temp dir.
func startAgent(t *testing.T, tweak ...func(*server.Config)) *testAgent {
	t.Helper()
	home, etc := t.TempDir(), t.TempDir()
	passwd := fmt.Sprintf("root:x:%d:%d:root:%s:/bin/sh\nalice:x:12345:12345::%s/alice:/bin/sh\n",
		os.Getuid(), os.Getgid(), home, home)
	group := fmt.Sprintf("root:x:%d:\nalice:x:12345:\nstaff:x:777:alice\n", os.Getgid())
	mustWrite(t, filepath.Join(etc, "passwd"), passwd)
	mustWrite(t, filepath.Join(etc, "group"), group)
	cfg := server.Config{
		Token:      testToken,
		PasswdPath: filepath.Join(etc, "passwd"),
		GroupPath:  filepath.Join(etc, "group"),
		BaseEnv:    []string{"PATH=/usr/local/bin:/usr/bin:/bin", "BASE_VAR=from-base", "HOME=/nonexistent"},
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range tweak {
		f(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = srv.Close()
	})
	url := "http://" + ln.Addr().String()
	return &testAgent{c: agent.NewClient(url, testToken, nil), url: url, home: home, etc: etc, srv: srv}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

type result struct {
	stdout, stderr, pty string
	end                 agent.Event
}

// collect reads a stream to its end.
func collect(t *testing.T, s *agent.ProcessStream) result {
	t.Helper()
	defer s.Close()
	var r result
	var out, errb, pty bytes.Buffer
	for {
		ev, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		switch ev.Kind {
		case agent.EventStdout:
			out.Write(ev.Data)
		case agent.EventStderr:
			errb.Write(ev.Data)
		case agent.EventPTY:
			pty.Write(ev.Data)
		case agent.EventEnd:
			r.end = ev
		}
	}
	r.stdout, r.stderr, r.pty = out.String(), errb.String(), pty.String()
	if r.end.Kind != agent.EventEnd {
		t.Fatalf("stream ended without an end event")
	}
	return r
}

func run(t *testing.T, c *agent.Client, req agent.ExecRequest) result {
	t.Helper()
	s, err := c.Start(testCtx(t), req)
	if err != nil {
		t.Fatalf("start %v: %v", req.Argv, err)
	}
	if s.PID() == 0 {
		t.Fatalf("start %v: no pid", req.Argv)
	}
	return collect(t, s)
}

func TestExecExitCodes(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		name     string
		argv     []string
		code     int
		exited   bool
		status   string
		stdout   string
		stderr   string
		wantPath bool
	}{
		{name: "zero", argv: []string{"true"}, code: 0, exited: true, status: "exit status 0"},
		{name: "three", argv: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, code: 3, exited: true,
			status: "exit status 3", stdout: "out\n", stderr: "err\n"},
		{name: "killed", argv: []string{"/bin/sh", "-c", "kill -9 $$"}, code: -1, exited: false, status: "signal: killed"},
		{name: "terminated", argv: []string{"/bin/sh", "-c", "kill -TERM $$"}, code: -1, exited: false, status: "signal: terminated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, a.c, agent.ExecRequest{Argv: tc.argv})
			if r.end.ExitCode != tc.code || r.end.Exited != tc.exited || r.end.Status != tc.status {
				t.Errorf("end = %+v, want code %d exited %v status %q", r.end, tc.code, tc.exited, tc.status)
			}
			if r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Errorf("stdout %q stderr %q, want %q %q", r.stdout, r.stderr, tc.stdout, tc.stderr)
			}
		})
	}
}

func TestExecEnvCwdUser(t *testing.T) {
	a := startAgent(t)
	if err := os.Mkdir(filepath.Join(a.home, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  agent.ExecRequest
		want string
	}{
		{"request env", agent.ExecRequest{Argv: []string{"sh", "-c", "echo $FOO"}, Env: map[string]string{"FOO": "bar"}}, "bar\n"},
		{"base env", agent.ExecRequest{Argv: []string{"sh", "-c", "echo $BASE_VAR"}}, "from-base\n"},
		{"request overrides base", agent.ExecRequest{Argv: []string{"sh", "-c", "echo $BASE_VAR"}, Env: map[string]string{"BASE_VAR": "x"}}, "x\n"},
		{"home from passwd", agent.ExecRequest{Argv: []string{"sh", "-c", "echo $HOME $USER $LOGNAME"}}, a.home + " root root\n"},
		{"default cwd is home", agent.ExecRequest{Argv: []string{"pwd"}}, a.home + "\n"},
		{"relative cwd", agent.ExecRequest{Argv: []string{"pwd"}, Cwd: "sub"}, filepath.Join(a.home, "sub") + "\n"},
		{"absolute cwd", agent.ExecRequest{Argv: []string{"pwd"}, Cwd: "/"}, "/\n"},
		{"explicit root user", agent.ExecRequest{Argv: []string{"sh", "-c", "echo $USER"}, User: "root"}, "root\n"},
		{"stdin is /dev/null", agent.ExecRequest{Argv: []string{"sh", "-c", "cat; echo done"}}, "done\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, a.c, tc.req)
			if r.stdout != tc.want || r.end.ExitCode != 0 {
				t.Errorf("stdout %q (exit %d, stderr %q), want %q", r.stdout, r.end.ExitCode, r.stderr, tc.want)
			}
		})
	}

	errTests := []struct {
		name string
		req  agent.ExecRequest
		want error
	}{
		{"missing cwd", agent.ExecRequest{Argv: []string{"pwd"}, Cwd: "/does/not/exist"}, errdefs.ErrInvalidArgument},
		{"cwd is a file", agent.ExecRequest{Argv: []string{"pwd"}, Cwd: a.etc + "/passwd"}, errdefs.ErrInvalidArgument},
		{"unknown user", agent.ExecRequest{Argv: []string{"pwd"}, User: "mallory"}, errdefs.ErrInvalidArgument},
		{"unknown command", agent.ExecRequest{Argv: []string{"no-such-command-xyz"}}, errdefs.ErrInvalidArgument},
		{"empty argv", agent.ExecRequest{}, errdefs.ErrInvalidArgument},
	}
	for _, tc := range errTests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := a.c.Start(testCtx(t), tc.req)
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestStdinAndClose(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	s, err := a.c.Start(ctx, agent.ExecRequest{Argv: []string{"sh", "-c", "tr a-z A-Z; echo EOF"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.c.SendStdin(ctx, s.PID(), []byte("hello ")); err != nil {
		t.Fatal(err)
	}
	if err := a.c.SendStdin(ctx, s.PID(), []byte("world\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.c.CloseStdin(ctx, s.PID()); err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	if r.stdout != "HELLO WORLD\nEOF\n" || r.end.ExitCode != 0 {
		t.Fatalf("got %q exit %d", r.stdout, r.end.ExitCode)
	}

	// Input to a finished process, or one without stdin, is a failed precondition.
	if err := a.c.SendStdin(ctx, s.PID(), []byte("x")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("stdin after exit: %v, want ErrFailedPrecondition", err)
	}
	s2, err := a.c.Start(ctx, agent.ExecRequest{Argv: []string{"sleep", "5"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.c.SendStdin(ctx, s2.PID(), []byte("x")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("stdin without stdin: %v, want ErrFailedPrecondition", err)
	}
	if err := a.c.Signal(ctx, s2.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	collect(t, s2)
	if err := a.c.SendStdin(ctx, 999999, []byte("x")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("stdin to unknown pid: %v, want ErrNotFound", err)
	}
}

func TestSignals(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	tests := []struct {
		sig    syscall.Signal
		status string
	}{
		{syscall.SIGTERM, "signal: terminated"},
		{syscall.SIGKILL, "signal: killed"},
		{syscall.SIGUSR1, "signal: user defined signal 1"},
	}
	for _, tc := range tests {
		t.Run(tc.status, func(t *testing.T) {
			// The shell's child (sleep) is in the same process group and must die too.
			s, err := a.c.Start(ctx, agent.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 & echo $!; wait"}})
			if err != nil {
				t.Fatal(err)
			}
			ev, err := s.Recv()
			if err != nil || ev.Kind != agent.EventStdout {
				t.Fatalf("first event %+v, %v", ev, err)
			}
			child, err := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
			if err != nil {
				t.Fatalf("child pid %q: %v", ev.Data, err)
			}
			if err := a.c.Signal(ctx, s.PID(), tc.sig); err != nil {
				t.Fatal(err)
			}
			r := collect(t, s)
			if r.end.Status != tc.status || r.end.ExitCode != -1 || r.end.Exited {
				t.Errorf("end %+v, want status %q", r.end, tc.status)
			}
			waitGone(t, child)
		})
	}
	if err := a.c.Signal(ctx, 999999, syscall.SIGTERM); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("signal unknown pid: %v, want ErrNotFound", err)
	}
}

// waitGone waits until pid no longer runs (gone, or a zombie waiting for its reaper).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("process %d still running", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

func TestBackgroundAndConnectReplay(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	s, err := a.c.Start(ctx, agent.ExecRequest{
		Argv: []string{"sh", "-c", "echo one; sleep 0.3; echo two >&2; sleep 0.2; echo three; exit 7"},
		Tag:  "bg",
	})
	if err != nil {
		t.Fatal(err)
	}
	pid := s.PID()
	s.Close() // detach: no deadline, so the process keeps running

	procs, err := a.c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := findProc(procs, pid); p == nil || !p.Running || p.Tag != "bg" || p.ExitCode != nil || p.Argv[0] != "sh" {
		t.Fatalf("running process in list: %+v", p)
	}

	cs, err := a.c.Connect(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	if cs.PID() != pid {
		t.Fatalf("connect pid %d, want %d", cs.PID(), pid)
	}
	r := collect(t, cs)
	if r.stdout != "one\nthree\n" || r.stderr != "two\n" || r.end.ExitCode != 7 {
		t.Fatalf("connect: %+v", r)
	}

	// After the end: replay and end again.
	cs, err = a.c.Connect(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	r = collect(t, cs)
	if r.stdout != "one\nthree\n" || r.end.ExitCode != 7 {
		t.Fatalf("second connect: %+v", r)
	}
	procs, err = a.c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := findProc(procs, pid); p == nil || p.Running || p.ExitCode == nil || *p.ExitCode != 7 || p.StartedAt.IsZero() {
		t.Fatalf("finished process in list: %+v", p)
	}
	if _, err := a.c.Connect(ctx, 999999); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("connect unknown: %v", err)
	}
}

func findProc(ps []agent.ProcessInfo, pid uint32) *agent.ProcessInfo {
	for i := range ps {
		if ps[i].PID == pid {
			return &ps[i]
		}
	}
	return nil
}

func TestDeadlineKillsCancelDetaches(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)

	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	s, err := a.c.Start(dctx, agent.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	pid := s.PID()
	for {
		if _, err := s.Recv(); err != nil {
			break
		}
	}
	s.Close()
	end := waitEnd(t, a.c, pid)
	if end.Running || end.ExitCode == nil || *end.ExitCode != -1 {
		t.Fatalf("after deadline: %+v", end)
	}

	cctx, ccancel := context.WithCancel(ctx)
	s, err = a.c.Start(cctx, agent.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	pid = s.PID()
	ccancel()
	s.Close()
	time.Sleep(300 * time.Millisecond)
	procs, err := a.c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := findProc(procs, pid); p == nil || !p.Running {
		t.Fatalf("cancelled stream killed the process: %+v", p)
	}
	if err := a.c.Signal(ctx, pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, a.c, pid)
}

func waitEnd(t *testing.T, c *agent.Client, pid uint32) agent.ProcessInfo {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		procs, err := c.Processes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if p := findProc(procs, pid); p != nil && !p.Running {
			return *p
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d did not end", pid)
	return agent.ProcessInfo{}
}

func TestPTY(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skip("no /dev/ptmx")
	}
	a := startAgent(t)
	ctx := testCtx(t)
	s, err := a.c.Start(ctx, agent.ExecRequest{Argv: []string{"sh"}, PTY: &agent.PTYSize{Cols: 80, Rows: 24},
		Env: map[string]string{"PS1": "$ "}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out bytes.Buffer
	expect := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("pty output %q lacks %q", out.String(), want)
			}
			ev, err := s.Recv()
			if err != nil {
				t.Fatalf("recv: %v (output %q)", err, out.String())
			}
			if ev.Kind == agent.EventStdout || ev.Kind == agent.EventStderr {
				t.Fatalf("pty process produced %v", ev.Kind)
			}
			out.Write(ev.Data)
		}
	}
	if err := a.c.SendPTY(ctx, s.PID(), []byte("echo hi-$((40+2))\n")); err != nil {
		t.Fatal(err)
	}
	expect("hi-42")
	if err := a.c.SendPTY(ctx, s.PID(), []byte("tty; stty size\n")); err != nil {
		t.Fatal(err)
	}
	expect("24 80")
	if !strings.Contains(out.String(), "/dev/pts/") {
		t.Errorf("tty not a pts: %q", out.String())
	}
	if err := a.c.Resize(ctx, s.PID(), agent.PTYSize{Cols: 132, Rows: 43}); err != nil {
		t.Fatal(err)
	}
	if err := a.c.SendStdin(ctx, s.PID(), []byte("stty size; exit 5\n")); err != nil { // stdin goes to the pty too
		t.Fatal(err)
	}
	expect("43 132")
	for {
		ev, err := s.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if ev.Kind == agent.EventEnd {
			if ev.ExitCode != 5 {
				t.Fatalf("exit %d", ev.ExitCode)
			}
			break
		}
	}
	if err := a.c.Resize(ctx, s.PID(), agent.PTYSize{Cols: 1, Rows: 1}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("resize after exit: %v", err)
	}
}

func TestTokenRejected(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	tests := []struct {
		name  string
		token string
	}{{"wrong", "nope"}, {"missing", ""}, {"prefix", testToken[:4]}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := agent.NewClient(a.url, tc.token, nil)
			if err := c.Health(ctx); err != nil {
				t.Fatalf("health needs no token: %v", err)
			}
			if _, err := c.Stat(ctx, "/"); !errors.Is(err, errdefs.ErrUnauthenticated) {
				t.Errorf("stat: %v", err)
			}
			if _, err := c.Start(ctx, agent.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrUnauthenticated) {
				t.Errorf("start: %v", err)
			}
			if _, err := c.Upload(ctx, "x", 0, "", strings.NewReader("x")); !errors.Is(err, errdefs.ErrUnauthenticated) {
				t.Errorf("upload: %v", err)
			}
			if _, _, err := c.Download(ctx, "/etc/hostname", ""); !errors.Is(err, errdefs.ErrUnauthenticated) {
				t.Errorf("download: %v", err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(a.home, "x")); err == nil {
		t.Error("unauthenticated upload wrote a file")
	}
}

func TestWaitReady(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 2*time.Second)
	defer cancel()
	if err := a.c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	// Nothing listens: WaitReady gives up with ErrUnavailable when ctx ends, without spinning.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := agent.NewClient("http://"+addr, "", nil)
	ctx, cancel = context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = c.WaitReady(ctx)
	if !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Fatalf("returned after %v", d)
	}

	// The agent comes up late: WaitReady notices.
	lateLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lateAddr := lateLn.Addr().String()
	lateLn.Close()
	srv, err := server.New(server.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	go func() {
		time.Sleep(100 * time.Millisecond)
		if ln, err := net.Listen("tcp", lateAddr); err == nil {
			_ = srv.Serve(sctx, ln)
		}
	}()
	ctx, cancel = context.WithTimeout(testCtx(t), 3*time.Second)
	defer cancel()
	if err := agent.NewClient("http://"+lateAddr, "", nil).WaitReady(ctx); err != nil {
		t.Fatalf("late agent: %v", err)
	}
}

// TestRotateToken: the holder of the current token gives the agent a new one; from then on only
// the new one works (a forked copy of a sandbox no longer answers to its parent's token).
func TestRotateToken(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	if err := agent.NewClient(a.url, "nope", nil).Rotate(ctx, "stolen"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("rotate with a wrong token: %v", err)
	}
	if err := a.c.Rotate(ctx, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("rotate to an empty token: %v", err)
	}
	if err := a.c.Rotate(ctx, "fresh-token"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Stat(ctx, "/"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("old token still works: %v", err)
	}
	if _, _, err := a.c.Download(ctx, "/etc/hostname", ""); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("old token still works for files: %v", err)
	}
	if _, err := agent.NewClient(a.url, "fresh-token", nil).Stat(ctx, "/"); err != nil {
		t.Fatalf("new token: %v", err)
	}
}

// TestInitEnv: variables given through /init reach every later command, over the base
// environment and under the command's own; a new set replaces the old; bad names are refused.
func TestInitEnv(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	if err := a.c.SetEnv(ctx, map[string]string{"FROM_INIT": "yes", "BASE_VAR": "init-wins"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "yes init-wins\n"},
		{map[string]string{"FROM_INIT": "request-wins"}, "request-wins init-wins\n"},
	} {
		r := run(t, a.c, agent.ExecRequest{Argv: []string{"sh", "-c", "echo $FROM_INIT $BASE_VAR"}, Env: tc.env})
		if r.stdout != tc.want {
			t.Errorf("env %v: %q, want %q", tc.env, r.stdout, tc.want)
		}
	}
	if err := a.c.SetEnv(ctx, map[string]string{"OTHER": "1"}); err != nil {
		t.Fatal(err)
	}
	if r := run(t, a.c, agent.ExecRequest{Argv: []string{"sh", "-c", "echo ${FROM_INIT:-gone} $BASE_VAR"}}); r.stdout != "gone from-base\n" {
		t.Errorf("after a new set: %q", r.stdout)
	}
	if err := a.c.SetEnv(ctx, map[string]string{"A=B": "x"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad name: %v", err)
	}
	if err := agent.NewClient(a.url, "nope", nil).SetEnv(ctx, map[string]string{"X": "1"}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("wrong token: %v", err)
	}
}
