// Command space is SPACE's command-line client: it creates, lists and deletes sandboxes, runs
// commands in them (streamed, or as an interactive shell), runs code in their code interpreter
// and copies files in and out, all through the public Go SDK in pkg/client.
//
// The server is SPACE_URL (default http://127.0.0.1:7070) or --url; the API key is --key, else
// SPACE_API_KEY, else the file $SPACE_HOME/admin.key (SPACE_HOME defaults to ./.space). When the
// server refuses the key, the CLI says where it looked.
// Exit status: 0 on success, the command's own status for exec and shell, 1 when the server or
// the network failed (or, for run-code, when the code raised), 2 for a usage error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// version is set at build time with -ldflags "-X main.version=…" (the Makefile does).
var version = "dev"

const (
	defaultURL  = "http://127.0.0.1:7070"
	defaultHome = "./.space"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	// exitInterrupted is the shell's status for a command ended by SIGINT.
	exitInterrupted = 130
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	a := &app{
		ctx: ctx, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr,
		getenv: os.Getenv, term: newOSTerminal(os.Stdin),
	}
	code := a.main(os.Args[1:])
	stop()
	os.Exit(code)
}

// run runs the CLI with args (without the program name) and returns the exit status. Standard
// input and the environment are the process's.
func run(args []string, stdout, stderr io.Writer) int {
	a := &app{
		ctx: context.Background(), stdin: os.Stdin, stdout: stdout, stderr: stderr,
		getenv: os.Getenv, term: newOSTerminal(os.Stdin),
	}
	return a.main(args)
}

// app is one invocation of the CLI and everything it touches outside itself.
type app struct {
	ctx            context.Context
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	term           terminal // the terminal behind stdin, for space shell

	global globalFlags
	client *client.Client
	server string // the server's URL, once connect has chosen it
	// keyFrom says where connect found the API key ("--key", "SPACE_API_KEY" or the file's
	// path), or, when it found none, where it looked; for the message when the server refuses.
	keyFrom  string
	keyFound bool
	// slowAfter is how long a create may take before the CLI says what it waits for, and then
	// how often it says it again; 0 means 3 s, then every 30 s.
	slowAfter time.Duration
}

// usageError is a mistake in the command line; it exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitCode is a command's exit status that the CLI passes on.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// command is one subcommand.
type command struct {
	name  string
	usage string // the arguments, for the usage text
	short string
	run   func(a *app, args []string) error
}

func commands() []command {
	return []command{
		{"create", "[--template T | --from-snapshot S] [--timeout S] [--env K=V]... [--meta k=v]... [--memory MiB] [--vcpus N]", "create a sandbox and print its ID", (*app).cmdCreate},
		{"ls", "[--state S] [--meta k=v]...", "list sandboxes", (*app).cmdList},
		{"info", "[ID]", "show a sandbox, or the server without ID", (*app).cmdInfo},
		{"exec", "ID [--env K=V]... [--cwd D] [--user U] [--timeout S] [-i] (-c 'shell string' | [--] CMD ARGS...)", "run a command, streaming its output", (*app).cmdExec},
		{"shell", "ID [-- CMD ARGS...]", "open an interactive shell", (*app).cmdShell},
		{"run-code", runCodeUsage, "run code in a sandbox's code interpreter, streaming its output; saves images and HTML as result-N files", (*app).cmdRunCode},
		{"code-contexts", codeContextsUsage, "list, create, delete or restart a code interpreter's contexts (one kernel each)", (*app).cmdCodeContexts},
		{"cp", "(LOCAL|-) ID:/path | ID:/path (LOCAL|-)", "copy a file into or out of a sandbox", (*app).cmdCopy},
		{"rm", "ID...", "delete sandboxes", (*app).cmdRemove},
		{"pause", "ID", "pause a sandbox: memory, processes and files saved to disk", (*app).cmdPause},
		{"resume", "ID", "resume a paused sandbox where it stopped", (*app).cmdResume},
		{"fork", "ID [--count N]", "make running copies of a sandbox; prints their IDs", (*app).cmdFork},
		{"snapshot", "ID [--full] [--label L]", "snapshot a sandbox's files (or, --full, its whole running state); prints the ID", (*app).cmdSnapshot},
		{"snapshots", "[ID] | rm SNAPSHOT...", "list snapshots (of a sandbox, or all), or delete them", (*app).cmdSnapshots},
		{"restore", "ID SNAPSHOT [PATH...]", "restore a sandbox, or only PATHs, to a snapshot", (*app).cmdRestore},
		{"lineage", "ID", "show the tree of sandboxes and snapshots a sandbox belongs to", (*app).cmdLineage},
		{"diff", "SNAPSHOT AGAINST", "list files added, modified or deleted from AGAINST to SNAPSHOT", (*app).cmdDiff},
		{"key", "create TENANT | ls | rm KEY_ID...", "create an API key for a tenant, list keys, or revoke keys at once (admin)", (*app).cmdKey},
		{"keys", "ls | rm KEY_ID...", "the same as key", (*app).cmdKey},
		{"version", "", "print the CLI's version and the server's", (*app).cmdVersion},
		{"template", "ls | rm NAME... | build NAME --from T [--run CMD] [--env K=V] [--workdir D] [--copy L:/P]", "list, delete or build templates (build steps run in order)", (*app).cmdTemplate},
	}
}

func (a *app) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: space [--url URL] [--key KEY] [--json] COMMAND [ARGS]\n\ncommands:\n")
	width := 0
	for _, c := range commands() {
		width = max(width, len(c.name))
	}
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-*s %s\n  %*s %s\n", width, c.name, c.short, width, "", c.usage)
	}
	fmt.Fprintf(w, "\nenvironment: SPACE_URL (default %s), SPACE_API_KEY, SPACE_HOME (default %s; the key is read from $SPACE_HOME/admin.key)\n", defaultURL, defaultHome)
}

// main parses the global flags, finds the command and runs it.
func (a *app) main(args []string) int {
	fs := a.newFlagSet("space", "COMMAND [ARGS]")
	// The flag package calls Usage for -h too, before returning ErrHelp: the usage is printed
	// here, once, to stdout for help and to stderr after a bad flag.
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, errHelp) {
			a.printUsage(a.stdout)
			return exitOK
		}
		a.printUsage(a.stderr)
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 {
		a.printUsage(a.stderr)
		return exitUsage
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		a.printUsage(a.stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name == name {
			return a.report(c.run(a, rest))
		}
	}
	fmt.Fprintf(a.stderr, "space: unknown command %q (see space help)\n", name)
	return exitUsage
}

// report turns a command's error into the exit status, printing it.
func (a *app) report(err error) int {
	var (
		ue     *usageError
		code   exitCode
		ae     *client.Error
		netErr *url.Error
	)
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &code):
		return int(code)
	case errors.Is(err, errHelp):
		return exitOK
	case a.ctx.Err() != nil && errors.Is(err, context.Canceled):
		return exitInterrupted // interrupted by the user: nothing to explain
	case errors.Is(err, errFlagParse):
		return exitUsage // the flag package has printed the problem and the usage
	case errors.As(err, &ue):
		fmt.Fprintf(a.stderr, "space: %s\n", ue.msg)
		return exitUsage
	case errors.As(err, &ae):
		fmt.Fprintf(a.stderr, "space: %s\n", ae.Message)
		if ae.Status == http.StatusUnauthorized {
			fmt.Fprintln(a.stderr, a.keyHint())
		}
		return exitError
	case errors.As(err, &netErr):
		fmt.Fprintf(a.stderr, "space: cannot reach the server: %v\n", netErr.Err)
		return exitError
	}
	fmt.Fprintf(a.stderr, "space: %v\n", err)
	return exitError
}

// connect makes the API client from the flags and the environment.
func (a *app) connect() (*client.Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	server := a.global.url
	if server == "" {
		server = a.getenv("SPACE_URL")
	}
	if server == "" {
		server = defaultURL
	}
	key, err := a.findKey()
	if err != nil {
		return nil, err
	}
	c, err := client.New(server, key, client.WithUserAgent("space-cli/"+version))
	if err != nil {
		return nil, usagef("%v", err)
	}
	a.client, a.server = c, server
	return c, nil
}

// findKey returns the API key: --key, else SPACE_API_KEY, else $SPACE_HOME/admin.key. No key at
// all is not an error here: the server answers 401, and keyHint says where the CLI looked.
func (a *app) findKey() (string, error) {
	if a.global.key != "" {
		a.keyFrom, a.keyFound = "--key", true
		return a.global.key, nil
	}
	if k := a.getenv("SPACE_API_KEY"); k != "" {
		a.keyFrom, a.keyFound = "SPACE_API_KEY", true
		return k, nil
	}
	home := a.getenv("SPACE_HOME")
	if home == "" {
		home = defaultHome
	}
	path := filepath.Join(home, "admin.key")
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	a.keyFrom = path
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		a.keyFound = true
		return strings.TrimSpace(string(b)), nil
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	}
	return "", fmt.Errorf("read API key: %w", err)
}

// keyHint explains, after the server refused the key, where the key came from or where the CLI
// looked for one, and how to give it one.
func (a *app) keyHint() string {
	const how = "  set SPACE_API_KEY or pass --key, or set SPACE_HOME to the spaced home that holds admin.key\n" +
		"  (spaced writes it to $SPACE_HOME/admin.key, ./.space/admin.key where `make run` was started)"
	switch {
	case a.keyFrom == "":
		return how
	case !a.keyFound:
		return "  no API key: --key not given, SPACE_API_KEY not set, no file " + a.keyFrom + "\n" + how
	case a.keyFrom == "--key" || a.keyFrom == "SPACE_API_KEY":
		return "  the key came from " + a.keyFrom + "\n" + how
	}
	return "  the key came from the file " + a.keyFrom + "\n" + how
}
