package main

import (
	"context"
	"fmt"

	"github.com/space-sandbox/space/pkg/client"
)

func (a *app) cmdPause(args []string) error {
	return a.oneSandbox("pause", args, (*client.Client).PauseSandbox)
}

func (a *app) cmdResume(args []string) error {
	return a.oneSandbox("resume", args, (*client.Client).ResumeSandbox)
}

// oneSandbox runs a call on one sandbox ID and prints the sandbox it returns.
func (a *app) oneSandbox(name string, args []string, call func(*client.Client, context.Context, string) (*client.Sandbox, error)) error {
	fs := a.newFlagSet(name, "ID")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: space %s ID", name)
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	return a.showSandbox(call(c, a.ctx, pos[0]))
}

// showSandbox prints a sandbox an API call returned, or returns the call's error.
func (a *app) showSandbox(sb *client.Sandbox, err error) error {
	if err != nil {
		return err
	}
	if a.global.json {
		return a.printJSON(sb)
	}
	printSandbox(a.stdout, sb)
	return nil
}

func (a *app) cmdFork(args []string) error {
	fs := a.newFlagSet("fork", "ID [--count N]")
	count := fs.Int("count", 1, "how many copies (1..10)")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: space fork ID [--count N]")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	copies, err := c.ForkSandbox(a.ctx, pos[0], *count)
	if err != nil {
		return err
	}
	if a.global.json {
		return a.printJSON(copies)
	}
	for _, sb := range copies {
		fmt.Fprintln(a.stdout, sb.ID)
	}
	return nil
}
