package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/space-sandbox/space/pkg/client"
)

// terminal is the local terminal behind standard input, as space shell uses it.
type terminal interface {
	IsTerminal() bool
	Size() (cols, rows int, err error)
	// MakeRaw puts the terminal in raw mode and returns the function that restores it.
	MakeRaw() (restore func() error, err error)
	// NotifyResize signals ch (without blocking) whenever the window size changes, until stop.
	NotifyResize(ch chan<- struct{}) (stop func())
}

// osTerminal is the process's terminal.
type osTerminal struct{ fd int }

func newOSTerminal(f *os.File) terminal { return osTerminal{fd: int(f.Fd())} }

func (t osTerminal) IsTerminal() bool                  { return term.IsTerminal(t.fd) }
func (t osTerminal) Size() (cols, rows int, err error) { return term.GetSize(t.fd) }

func (t osTerminal) MakeRaw() (func() error, error) {
	old, err := term.MakeRaw(t.fd)
	if err != nil {
		return nil, fmt.Errorf("raw terminal: %w", err)
	}
	return func() error { return term.Restore(t.fd, old) }, nil
}

func (t osTerminal) NotifyResize(ch chan<- struct{}) func() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sigs:
				select {
				case ch <- struct{}{}:
				default:
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

// cmdShell runs an interactive shell: the command runs in the background with a PTY of the
// terminal's size, its output comes from the process's event stream, keystrokes go to its
// standard input one read at a time, and window size changes follow. It ends with the shell.
func (a *app) cmdShell(args []string) error {
	fs := a.newFlagSet("shell", "ID [-- CMD ARGS...]")
	pos, argv, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("shell needs a sandbox ID")
	}
	if len(argv) == 0 {
		argv = []string{"/bin/sh"}
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	id := pos[0]

	tty := a.term != nil && a.term.IsTerminal()
	size := client.PTYSize{Cols: 80, Rows: 24}
	if tty {
		if cols, rows, err := a.term.Size(); err == nil && cols > 0 && rows > 0 {
			size = client.PTYSize{Cols: cols, Rows: rows}
		}
	}
	termName := a.getenv("TERM")
	if termName == "" {
		termName = "xterm-256color"
	}

	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	pid, err := c.ExecBackground(ctx, id, client.ExecRequest{
		Cmd: argv, PTY: &size, Env: map[string]string{"TERM": termName},
	})
	if err != nil {
		return err
	}
	events, err := c.ProcessEvents(ctx, id, pid)
	if err != nil {
		// Without its output the shell is of no use: do not leave it behind.
		c.Signal(context.WithoutCancel(ctx), id, pid, "SIGKILL") //nolint:errcheck // best effort
		return err
	}
	defer events.Close()

	if tty {
		restore, err := a.term.MakeRaw()
		if err != nil {
			return err
		}
		defer restore() //nolint:errcheck // nothing better to do if it fails
		resized := make(chan struct{}, 1)
		stop := a.term.NotifyResize(resized)
		defer stop()
		go a.followResize(ctx, c, id, pid, resized)
	}
	go a.pumpStdin(ctx, c, id, pid)

	res, err := client.FollowExec(events, func(ev client.ExecEvent) error {
		switch ev.Type {
		case client.EventStdout:
			_, err := a.stdout.Write(ev.Data)
			return err
		case client.EventStderr:
			_, err := a.stderr.Write(ev.Data)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return exitCode(res.ExitCode)
}

// pumpStdin posts what standard input yields to the process, each read as it comes; at the end
// of input it closes the process's standard input.
func (a *app) pumpStdin(ctx context.Context, c *client.Client, id string, pid int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := a.stdin.Read(buf)
		if n > 0 {
			if werr := c.WriteStdin(ctx, id, pid, bytes.NewReader(buf[:n]), false); werr != nil {
				return // the shell has gone, or the context ended
			}
		}
		if errors.Is(err, io.EOF) {
			c.CloseStdin(ctx, id, pid) //nolint:errcheck // the shell may be gone already
			return
		}
		if err != nil || ctx.Err() != nil {
			return
		}
	}
}

// followResize passes each window size change on to the process's PTY.
func (a *app) followResize(ctx context.Context, c *client.Client, id string, pid int, resized <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-resized:
			cols, rows, err := a.term.Size()
			if err != nil || cols <= 0 || rows <= 0 {
				continue
			}
			c.ResizePTY(ctx, id, pid, client.PTYSize{Cols: cols, Rows: rows}) //nolint:errcheck // the next resize retries
		}
	}
}
