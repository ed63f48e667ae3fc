package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

func (a *app) cmdExec(args []string) error {
	fs := a.newFlagSet("exec", "ID [flags] (-c 'shell string' | [--] CMD ARGS...)")
	var (
		req       client.ExecRequest
		env       = pairs{}
		shell     string
		withStdin bool
	)
	fs.Var(env, "env", "environment variable `K=V` (repeatable)")
	fs.StringVar(&req.Cwd, "cwd", "", "working `directory`")
	fs.StringVar(&req.User, "user", "", "run as this `user`")
	fs.IntVar(&req.TimeoutSeconds, "timeout", 0, "kill the command after `seconds` (it then exits 124)")
	fs.StringVar(&shell, "c", "", "run this `shell string` with /bin/sh -c")
	fs.BoolVar(&withStdin, "i", false, "send this program's standard input to the command")
	pos, argv, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("exec needs a sandbox ID")
	}
	switch {
	case shell != "" && len(argv) > 0:
		return usagef("exec takes either -c 'shell string' or a command, not both")
	case shell != "":
		req.Command = shell
	case len(argv) > 0:
		req.Cmd = argv
	default:
		return usagef("exec needs a command: space exec ID -- CMD ARGS... or space exec ID -c 'shell string'")
	}
	if req.TimeoutSeconds < 0 {
		return usagef("--timeout must not be negative")
	}
	req.Env = env.orNil()
	if withStdin {
		// The API takes stdin as one string in the request, so it is read whole first.
		b, err := io.ReadAll(a.stdin)
		if err != nil {
			return fmt.Errorf("read standard input: %w", err)
		}
		s := string(b)
		req.Stdin = &s
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	id := pos[0]

	if a.global.json {
		res, err := c.Exec(a.ctx, id, req)
		if err != nil {
			return err
		}
		if err := a.printJSON(res); err != nil {
			return err
		}
		return exitCode(res.ExitCode)
	}

	pid := 0
	res, err := c.ExecStream(a.ctx, id, req, func(ev client.ExecEvent) error {
		var w io.Writer
		switch ev.Type {
		case client.EventStart:
			pid = ev.PID
			return nil
		case client.EventStdout:
			w = a.stdout
		case client.EventStderr:
			w = a.stderr
		default:
			return nil
		}
		if _, err := w.Write(ev.Data); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		return nil
	})
	if err != nil {
		if a.ctx.Err() != nil && pid != 0 {
			// Interrupted here: interrupt the command there too, as a local one would be.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), 2*time.Second)
			c.Signal(ctx, id, pid, "SIGINT") //nolint:errcheck // best effort
			cancel()
		}
		return err
	}
	return exitCode(res.ExitCode)
}
