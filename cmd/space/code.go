package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/space-sandbox/space/pkg/client"
)

const runCodeUsage = "ID [--language L | --context CTX] [--timeout S] [--env K=V]... [--out DIR] (-c CODE | FILE | -)"

// runCodeArgs is a parsed `space run-code` command line.
type runCodeArgs struct {
	id  string
	req client.RunCodeRequest
	out string // where result files go
}

// parseRunCode parses `space run-code` and reads the code: the -c string, FILE, or standard
// input for "-".
func (a *app) parseRunCode(args []string) (runCodeArgs, error) {
	fs := a.newFlagSet("run-code", runCodeUsage)
	var (
		rc   runCodeArgs
		env  = pairs{}
		code string
		set  bool // -c was given, even empty
	)
	fs.StringVar(&rc.req.Language, "language", "", "`language` of the code: python (default), javascript, typescript or bash; inferred from FILE's extension")
	fs.StringVar(&rc.req.ContextID, "context", "", "run in this `context` (see space code-contexts); it has its language")
	fs.Float64Var(&rc.req.TimeoutSeconds, "timeout", 0, "interrupt the code after `seconds` (default the server's, 300)")
	fs.Var(env, "env", "environment variable `K=V` for this run (repeatable)")
	fs.StringVar(&rc.out, "out", ".", "`directory` for result files (result-N.png, .jpg, .svg, .pdf, .html)")
	fs.Func("c", "run this `code`", func(s string) error { code, set = s, true; return nil })
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return rc, err
	}
	if len(pos) == 0 {
		return rc, usagef("run-code needs a sandbox ID")
	}
	rc.id = pos[0]
	switch {
	case len(pos) > 2:
		return rc, usagef("run-code takes one FILE (or -), got %d", len(pos)-1)
	case set && len(pos) == 2:
		return rc, usagef("run-code takes either -c CODE or a FILE, not both")
	case !set && len(pos) == 1:
		return rc, usagef("run-code needs code: -c CODE, a FILE, or - for standard input")
	case rc.req.Language != "" && rc.req.ContextID != "":
		return rc, usagef("give --language or --context, not both: a context has its language")
	case rc.req.TimeoutSeconds < 0:
		return rc, usagef("--timeout must not be negative")
	}
	switch {
	case set:
		rc.req.Code = code
	case pos[1] == "-":
		b, err := io.ReadAll(a.stdin)
		if err != nil {
			return rc, fmt.Errorf("read standard input: %w", err)
		}
		rc.req.Code = string(b)
	default:
		b, err := os.ReadFile(pos[1])
		if err != nil {
			return rc, err
		}
		rc.req.Code = string(b)
		if rc.req.Language == "" && rc.req.ContextID == "" {
			rc.req.Language = languageForFile(pos[1])
		}
	}
	if strings.TrimSpace(rc.req.Code) == "" {
		return rc, usagef("run-code: the code is empty")
	}
	rc.req.Env = env.orNil()
	return rc, nil
}

// languageForFile is the code interpreter's language for a file name's extension, or "" (the
// server's default, python) when it tells none.
func languageForFile(name string) string {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".py":
		return "python"
	case ".js", ".mjs", ".cjs":
		return "javascript"
	case ".ts":
		return "typescript"
	case ".sh", ".bash":
		return "bash"
	}
	return ""
}

// cmdRunCode runs code in a sandbox's code interpreter: output is streamed to stdout and stderr
// as produced, text results are printed, images and HTML are saved as result-N files. An
// exception in the code prints its traceback and exits 1.
func (a *app) cmdRunCode(args []string) error {
	rc, err := a.parseRunCode(args)
	if err != nil {
		return err
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	if a.global.json {
		res, err := c.RunCode(a.ctx, rc.id, rc.req)
		if err != nil {
			return err
		}
		if err := a.printJSON(res); err != nil {
			return err
		}
		if res.Error != nil {
			return exitCode(exitError)
		}
		return nil
	}
	if rc.out != "." {
		if err := os.MkdirAll(rc.out, 0o755); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
	}
	p := &codePrinter{a: a, dir: rc.out}
	res, err := c.RunCodeStream(a.ctx, rc.id, rc.req, p.event)
	if err != nil {
		return err
	}
	if res.Error != nil || p.failed {
		return exitCode(exitError)
	}
	return nil
}

// codePrinter shows a running cell's events on the terminal.
type codePrinter struct {
	a      *app
	dir    string
	n      int  // results so far
	failed bool // a result file could not be written
}

func (p *codePrinter) event(ev client.CodeEvent) error {
	a := p.a
	var err error
	switch ev.Type {
	case client.CodeEventStdout:
		_, err = io.WriteString(a.stdout, ev.Text)
	case client.CodeEventStderr:
		_, err = io.WriteString(a.stderr, ev.Text)
	case client.CodeEventKernelRestarted:
		fmt.Fprintf(a.stderr, "space: the kernel was restarted before this run (%s): earlier state is gone\n", ev.Text)
	case client.CodeEventResult:
		p.n++
		err = p.result(p.n, *ev.Result)
	case client.CodeEventError:
		fmt.Fprint(a.stderr, withNewline(traceback(ev.Error)))
	}
	if err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// result saves result n's files, notes where, and prints its text: always for the main result,
// and for another only when it had nothing to save (a figure's "<Figure ...>" is left out).
func (p *codePrinter) result(n int, r client.CodeResult) error {
	files := resultFiles(n, r)
	for _, f := range files {
		path := filepath.Join(p.dir, f.name)
		if _, err := writeFileAtomic(path, bytes.NewReader(f.data)); err != nil {
			fmt.Fprintf(p.a.stderr, "space: result %d (%s): %v\n", n, f.mime, err)
			p.failed = true
			continue
		}
		fmt.Fprintf(p.a.stderr, "space: result %d (%s) saved to %s\n", n, f.mime, path)
	}
	text, ok := resultText(r)
	switch {
	case ok && (r.IsMain || len(files) == 0):
		_, err := io.WriteString(p.a.stdout, withNewline(text))
		return err
	case !ok && len(files) == 0:
		fmt.Fprintf(p.a.stderr, "space: result %d has nothing to show here (%s); --json shows it\n", n, strings.Join(r.MIMETypes(), ", "))
	}
	return nil
}

// resultFile is one file a result is saved as.
type resultFile struct {
	name string // result-<n>.<ext>
	mime string
	data []byte
}

// resultFiles returns the files result n is saved as: one per image, PDF or HTML type it has.
func resultFiles(n int, r client.CodeResult) []resultFile {
	var out []resultFile
	for _, t := range []struct{ mime, ext string }{
		{client.MIMEPNG, "png"}, {client.MIMEJPEG, "jpg"}, {client.MIMESVG, "svg"},
		{client.MIMEPDF, "pdf"}, {client.MIMEHTML, "html"},
	} {
		var data []byte
		switch t.mime {
		case client.MIMESVG, client.MIMEHTML:
			if s, ok := r.TextOf(t.mime); ok {
				data = []byte(s)
			}
		default:
			data, _ = r.BytesOf(t.mime)
		}
		if data != nil {
			out = append(out, resultFile{name: fmt.Sprintf("result-%d.%s", n, t.ext), mime: t.mime, data: data})
		}
	}
	return out
}

// resultText is what a result prints as: its text/plain, else its application/json.
func resultText(r client.CodeResult) (string, bool) {
	if s, ok := r.TextOf(client.MIMEText); ok {
		return s, true
	}
	if v, ok := r.JSON(); ok {
		return string(v), true
	}
	return "", false
}

// traceback is how an exception prints: its traceback, else its name and message.
func traceback(e *client.CodeError) string {
	if strings.TrimSpace(e.Traceback) != "" {
		return e.Traceback
	}
	return e.Error()
}

func withNewline(s string) string {
	if s == "" || strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}

const codeContextsUsage = "ID [ls | create [--language L] [--cwd D] | rm CTX... | restart CTX...]"

// cmdCodeContexts: space code-contexts ID [ls | create [--language L] [--cwd D] | rm CTX... |
// restart CTX...]; without a subcommand it lists.
func (a *app) cmdCodeContexts(args []string) error {
	const usage = "usage: space code-contexts " + codeContextsUsage
	fs := a.newFlagSet("code-contexts", codeContextsUsage)
	language := fs.String("language", "", "`language` of a new context: python (default), javascript, typescript or bash")
	cwd := fs.String("cwd", "", "working `directory` of a new context (default /home/user)")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef(usage)
	}
	id, sub, rest := pos[0], "ls", pos[1:]
	if len(rest) > 0 {
		sub, rest = rest[0], rest[1:]
	}
	switch {
	case sub == "ls" && len(rest) == 0:
	case sub == "create" && len(rest) == 0:
	case (sub == "rm" || sub == "restart") && len(rest) > 0:
	default:
		return usagef(usage)
	}
	if sub != "create" && (*language != "" || *cwd != "") {
		return usagef("--language and --cwd go with create")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	switch sub {
	case "ls":
		list, err := c.ListCodeContexts(a.ctx, id)
		if err != nil {
			return err
		}
		if a.global.json {
			if list == nil {
				list = []client.CodeContext{}
			}
			return a.printJSON(list)
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tLANGUAGE\tCWD\tRESTARTED")
		for _, cc := range list {
			restarted := "-"
			if cc.Restarted {
				restarted = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cc.ID, cc.Language, cc.Cwd, restarted)
		}
		return tw.Flush()
	case "create":
		cc, err := c.CreateCodeContext(a.ctx, id, *language, *cwd)
		if err != nil {
			return err
		}
		if a.global.json {
			return a.printJSON(cc)
		}
		fmt.Fprintln(a.stdout, cc.ID)
		return nil
	}
	for _, ctxID := range rest {
		if sub == "rm" {
			err = c.DeleteCodeContext(a.ctx, id, ctxID)
		} else {
			err = c.RestartCodeContext(a.ctx, id, ctxID)
		}
		if err != nil {
			return err
		}
		if !a.global.json {
			fmt.Fprintln(a.stdout, ctxID)
		}
	}
	return nil
}
