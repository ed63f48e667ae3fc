package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path"
	"strings"
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

// cmdShell runs a shell: the command runs in the background, its output comes from the
// process's event stream and what standard input yields goes to its standard input one read at
// a time. Without a command it is the sandbox user's login shell (loginShell). On a terminal the
// process gets a PTY of the terminal's size, which follows window size changes; otherwise (input
// from a file or a pipe, as `ssh -T`) it gets none, and the end of input closes its standard
// input, so that the shell reads EOF and exits. It ends with the process, with its status.
func (a *app) cmdShell(args []string) error {
	fs := a.newFlagSet("shell", "ID [-- CMD ARGS...]")
	pos, argv, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("shell needs a sandbox ID")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	id := pos[0]

	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	if len(argv) == 0 {
		if argv, err = loginShell(ctx, c, id); err != nil {
			return err
		}
	}
	req := client.ExecRequest{Cmd: argv}
	tty := a.term != nil && a.term.IsTerminal()
	if tty {
		size := client.PTYSize{Cols: 80, Rows: 24}
		if cols, rows, err := a.term.Size(); err == nil && cols > 0 && rows > 0 {
			size = client.PTYSize{Cols: cols, Rows: rows}
		}
		termName := a.getenv("TERM")
		if termName == "" {
			termName = "xterm-256color"
		}
		req.PTY, req.Env = &size, map[string]string{"TERM": termName}
	}
	pid, err := c.ExecBackground(ctx, id, req)
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
	go a.pumpStdin(ctx, c, id, pid, tty)

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

// fallbackShell is the shell of a sandbox whose user has no usable login shell.
func fallbackShell() []string { return []string{"/bin/sh", "-l"} }

// loginShellLookup prints the passwd entry of the user commands run as, through NSS if the image
// has getent, else from /etc/passwd.
const loginShellLookup = `u=$(id -un) && { getent passwd "$u" || grep "^$u:" /etc/passwd; }`

// loginShell returns the command line of the login shell of the sandbox's user (the one its
// commands run as), from the sandbox's own passwd database: [shell, "-l"], or /bin/sh -l when
// the lookup finds no usable shell. Only an API failure is an error.
func loginShell(ctx context.Context, c *client.Client, id string) ([]string, error) {
	res, err := c.Exec(ctx, id, client.ExecRequest{Cmd: []string{"/bin/sh", "-c", loginShellLookup}, TimeoutSeconds: 10})
	if err != nil {
		var ae *client.Error
		if errors.As(err, &ae) && ae.Status < 500 && ae.Status != http.StatusNotFound && ae.Status != http.StatusUnauthorized {
			// The image cannot run the lookup (no /bin/sh, say): the fallback may still work.
			return fallbackShell(), nil
		}
		return nil, err
	}
	if res.ExitCode != 0 {
		return fallbackShell(), nil
	}
	if sh := passwdShell(res.Stdout); sh != "" {
		return []string{sh, "-l"}, nil
	}
	return fallbackShell(), nil
}

// passwdShell returns the login shell of the first passwd entry in out, or "" when there is none
// usable: not an absolute path, or one that refuses logins (nologin, false).
func passwdShell(out string) string {
	line, _, _ := strings.Cut(out, "\n")
	f := strings.Split(strings.TrimRight(line, "\r"), ":")
	if len(f) != 7 {
		return ""
	}
	sh := f[6]
	if !path.IsAbs(sh) {
		return ""
	}
	switch path.Base(sh) {
	case "nologin", "false":
		return ""
	}
	return sh
}

// pumpStdin posts what standard input yields to the process, each read as it comes. At the end
// of input it closes the process's standard input; a PTY has no standard input of its own to
// close, so it gets the terminal's end-of-file character (^D) instead.
func (a *app) pumpStdin(ctx context.Context, c *client.Client, id string, pid int, pty bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := a.stdin.Read(buf)
		if n > 0 {
			if werr := c.WriteStdin(ctx, id, pid, bytes.NewReader(buf[:n]), false); werr != nil {
				return // the shell has gone, or the context ended
			}
		}
		if errors.Is(err, io.EOF) {
			if pty {
				c.WriteStdin(ctx, id, pid, strings.NewReader("\x04"), false) //nolint:errcheck // the shell may be gone already
			} else {
				c.CloseStdin(ctx, id, pid) //nolint:errcheck // the shell may be gone already
			}
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
