package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	codeserver "github.com/space-sandbox/space/internal/codeinterp/server"
	"github.com/space-sandbox/space/pkg/client"
)

// TestCodeInterpreter drives the code interpreter through the native API (the Go SDK) and the
// CLI: state across calls, streaming, errors, rich results, bad input that changes nothing,
// timeouts and a dead kernel that leave a usable one, contexts, and kernel state through pause
// and resume, a full snapshot, a fork and a restart of spaced, then a filesystem snapshot,
// whose kernels restart and say so.
func TestCodeInterpreter(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	id := create(t, c, client.CreateSandboxRequest{Template: "code-interpreter"}).ID
	runOK := func(id, code string) *client.CodeExecution {
		t.Helper()
		ex, err := c.RunCode(ctx, id, client.RunCodeRequest{Code: code})
		if err != nil {
			t.Fatalf("run %q: %v", code, err)
		}
		if ex.Error != nil {
			t.Fatalf("run %q: %v", code, ex.Error)
		}
		return ex
	}

	t.Run("state, streaming, errors, rich results", func(t *testing.T) {
		runOK(id, "x = 21")
		if got := runOK(id, "x * 2").Text(); got != "42" {
			t.Fatalf("x * 2 = %q", got)
		}
		var events []string
		var firstOut, end time.Time
		ex, err := c.RunCodeStream(ctx, id, client.RunCodeRequest{Code: "import sys, time\nprint('a', flush=True)\ntime.sleep(1)\nprint('b', file=sys.stderr)\n'done'"},
			func(ev client.CodeEvent) error {
				events = append(events, ev.Type)
				if ev.Type == client.CodeEventStdout && firstOut.IsZero() {
					firstOut = time.Now()
				}
				if ev.Type == client.CodeEventEnd {
					end = time.Now()
				}
				return nil
			})
		if err != nil || ex.Stdout != "a\n" || ex.Stderr != "b\n" || ex.Text() != "done" {
			t.Fatalf("stream: %+v %v (events %v)", ex, err, events)
		}
		if end.Sub(firstOut) < 500*time.Millisecond {
			t.Errorf("stdout came %s before the end: not streamed", end.Sub(firstOut))
		}
		ex = runOK(id, "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()")
		if len(ex.Results) == 0 {
			t.Fatal("plt.show() gave no result")
		}
		if png, ok := ex.Results[0].PNG(); !ok || !bytes.HasPrefix(png, []byte("\x89PNG")) {
			t.Fatalf("plt.show(): %v", ex.Results[0].MIMETypes())
		}
		if html, ok := runOK(id, "import pandas as pd\npd.DataFrame({'a': [1]})").MainResult().HTML(); !ok || !strings.Contains(html, "<table") {
			t.Fatalf("DataFrame html: %q", html)
		}
		ex, err = c.RunCode(ctx, id, client.RunCodeRequest{Code: "1/0"})
		if err != nil || ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || !strings.Contains(ex.Error.Traceback, "ZeroDivisionError") {
			t.Fatalf("1/0: %+v %v", ex, err)
		}
		runOKLang(t, c, id, "bash", "cd /tmp && export V=7")
		if out := runOKLang(t, c, id, "bash", "echo $V $PWD").Stdout; out != "7 /tmp\n" {
			t.Fatalf("bash state: %q", out)
		}
		runOKLang(t, c, id, "javascript", "let n = 40")
		if got := runOKLang(t, c, id, "js", "n + 2").Text(); got != "42" {
			t.Fatalf("javascript state: %q", got)
		}
	})

	t.Run("bad input changes nothing", func(t *testing.T) {
		minimal := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
		for _, bad := range []struct {
			id     string
			req    client.RunCodeRequest
			status int
		}{
			{id, client.RunCodeRequest{Code: "1", Language: "cobol"}, 400},
			{id, client.RunCodeRequest{Code: "1", ContextID: "no-such-context"}, 404},
			{id, client.RunCodeRequest{Code: "1", Language: "python", ContextID: "x"}, 400},
			{id, client.RunCodeRequest{Code: strings.Repeat("#", 1<<20+1)}, 413},
			{id, client.RunCodeRequest{Code: ""}, 400},
			{id, client.RunCodeRequest{Code: "1", TimeoutSeconds: -1}, 400},
			{id, client.RunCodeRequest{Code: "1", Env: map[string]string{"1BAD": "x"}}, 400},
			{minimal, client.RunCodeRequest{Code: "1"}, 409},
			{"sbx_nosuchsandbox00000000", client.RunCodeRequest{Code: "1"}, 404},
		} {
			_, err := c.RunCode(ctx, bad.id, bad.req)
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Status != bad.status {
				t.Errorf("%.60v: want %d, got %v", bad.req, bad.status, err)
			}
		}
		if got := runOK(id, "x").Text(); got != "21" {
			t.Fatalf("after bad input x = %q", got)
		}
	})

	t.Run("timeout and a dead kernel leave a usable one", func(t *testing.T) {
		t0 := time.Now()
		ex, err := c.RunCode(ctx, id, client.RunCodeRequest{Code: "import time; time.sleep(60)", TimeoutSeconds: 2})
		if err != nil || ex.Error == nil || ex.Error.Name != "TimeoutError" || time.Since(t0) > 20*time.Second {
			t.Fatalf("timeout: %+v %v after %s", ex, err, time.Since(t0))
		}
		if got := runOK(id, "x + 1").Text(); got != "22" {
			t.Fatalf("after the timeout: %q", got)
		}
		ex, err = c.RunCode(ctx, id, client.RunCodeRequest{Code: "import os; os.kill(os.getpid(), 9)"})
		if err != nil || ex.Error == nil || ex.Error.Name != "DeadKernelError" {
			t.Fatalf("killed kernel: %+v %v", ex, err)
		}
		ex, err = c.RunCode(ctx, id, client.RunCodeRequest{Code: "'x' in globals()"})
		if err != nil || ex.KernelRestarted == "" || ex.Text() != "False" {
			t.Fatalf("after the kernel died: %+v %v", ex, err)
		}
		runOK(id, "x = 21")
	})

	t.Run("contexts", func(t *testing.T) {
		cc, err := c.CreateCodeContext(ctx, id, "python", "/tmp")
		if err != nil || cc.Cwd != "/tmp" {
			t.Fatalf("create context: %+v %v", cc, err)
		}
		run := func(code string) *client.CodeExecution {
			ex, err := c.RunCode(ctx, id, client.RunCodeRequest{Code: code, ContextID: cc.ID})
			if err != nil {
				t.Fatal(err)
			}
			return ex
		}
		if got := run("import os; os.getcwd()").Text(); got != "/tmp" {
			t.Fatalf("cwd %q", got)
		}
		if ex := run("x"); ex.Error == nil || ex.Error.Name != "NameError" {
			t.Fatalf("contexts share state: %+v", ex)
		}
		list, err := c.ListCodeContexts(ctx, id)
		if err != nil || !hasContext(list, cc.ID) {
			t.Fatalf("list: %+v %v", list, err)
		}
		run("y = 1")
		if err := c.RestartCodeContext(ctx, id, cc.ID); err != nil {
			t.Fatal(err)
		}
		if ex := run("y"); ex.Error == nil || ex.Error.Name != "NameError" {
			t.Fatalf("after restart: %+v", ex)
		}
		if err := c.DeleteCodeContext(ctx, id, cc.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RunCode(ctx, id, client.RunCodeRequest{Code: "1", ContextID: cc.ID}); !isStatus(err, 404) {
			t.Fatalf("removed context: %v", err)
		}
		if err := c.DeleteCodeContext(ctx, id, cc.ID); !isStatus(err, 404) {
			t.Fatalf("remove twice: %v", err)
		}
	})

	t.Run("limits", func(t *testing.T) {
		// Contexts are capped per sandbox (bash ones are cheap enough to reach the cap).
		var made []string
		var last error
		for range 40 {
			cc, err := c.CreateCodeContext(ctx, id, "bash", "")
			if err != nil {
				last = err
				break
			}
			made = append(made, cc.ID)
		}
		list, err := c.ListCodeContexts(ctx, id)
		if !isStatus(last, 429) || err != nil || len(list) > 32 {
			t.Errorf("after %d more contexts: %v; %d listed (%v)", len(made), last, len(list), err)
		}
		for _, cc := range made {
			if err := c.DeleteCodeContext(ctx, id, cc); err != nil {
				t.Fatal(err)
			}
		}
		// A JSON answer holds at most 16 MiB of output; a stream has no such bound.
		_, err = c.RunCode(ctx, id, client.RunCodeRequest{Code: "print('x' * (20 << 20))"})
		if !isStatus(err, 413) {
			t.Errorf("20 MiB of output in one JSON answer: %v", err)
		}
		n := 0
		ex, err := c.RunCodeStream(ctx, id, client.RunCodeRequest{Code: "print('x' * (20 << 20))"}, func(ev client.CodeEvent) error {
			n += len(ev.Text)
			return nil
		})
		if err != nil || n < 20<<20 || ex.Error != nil {
			t.Errorf("20 MiB streamed: %d bytes, %v", n, err)
		}
		if got := runOK(id, "x").Text(); got != "21" {
			t.Fatalf("after the limits x = %q", got)
		}
	})

	t.Run("cli", func(t *testing.T) {
		out := t.TempDir()
		space := func(args ...string) (string, string, int) { return runSpace(t, d, "", args...) }
		if so, se, code := space("run-code", id, "-c", "print('hi'); x * 2"); code != 0 || so != "hi\n42\n" {
			t.Fatalf("run-code: %q %q %d", so, se, code)
		}
		so, se, code := space("run-code", id, "--out", out, "-c", "import matplotlib.pyplot as plt\nplt.bar([1], [2])\nplt.show()")
		png, err := os.ReadFile(filepath.Join(out, "result-1.png"))
		if code != 0 || err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
			t.Fatalf("run-code --out: %q %q %d %v", so, se, code, err)
		}
		if _, se, code := space("run-code", id, "-c", "raise ValueError('nope')"); code != 1 || !strings.Contains(se, "ValueError") {
			t.Fatalf("run-code error: %q %d", se, code)
		}
		if so, _, code := space("run-code", id, "--language", "bash", "-c", "echo from-bash"); code != 0 || so != "from-bash\n" {
			t.Fatalf("run-code bash: %q %d", so, code)
		}
	})

	t.Run("kernel state is sandbox state", func(t *testing.T) {
		runOK(id, "import pandas as pd\nv = 'parent'\ndf = pd.DataFrame({'n': range(1000)})")
		check := func(id, what string) {
			t.Helper()
			if got := runOK(id, "f'{v} {int(df.n.sum())}'").Text(); got != "parent 499500" {
				t.Fatalf("%s: %q", what, got)
			}
		}
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ResumeSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		check(id, "after pause and resume")
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := d.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		check(id, "after spaced restarted")
		full, err := c.CreateSnapshot(ctx, id, client.SnapshotFull, "")
		if err != nil {
			t.Fatal(err)
		}
		fromFull := create(t, c, client.CreateSandboxRequest{FromSnapshot: full.ID}).ID
		check(fromFull, "from a full snapshot")
		forks, err := c.ForkSandbox(ctx, id, 1)
		if err != nil || len(forks) != 1 {
			t.Fatalf("fork: %v %v", forks, err)
		}
		check(forks[0].ID, "in the fork")
		runOK(forks[0].ID, "v = 'fork'")
		check(id, "in the parent after the fork changed its copy")

		before, err := c.ListCodeContexts(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		files, err := c.CreateSnapshot(ctx, id, client.SnapshotFilesystem, "")
		if err != nil {
			t.Fatal(err)
		}
		fromFiles := create(t, c, client.CreateSandboxRequest{FromSnapshot: files.ID}).ID
		after, err := c.ListCodeContexts(ctx, fromFiles)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range before {
			if !hasContext(after, b.ID) {
				t.Errorf("context %s (%s) is gone after the filesystem snapshot: %+v", b.ID, b.Language, after)
			}
		}
		ex, err := c.RunCode(ctx, fromFiles, client.RunCodeRequest{Code: "'v' in globals()"})
		if err != nil || ex.Text() != "False" || ex.KernelRestarted == "" {
			t.Fatalf("from a filesystem snapshot the kernel must restart and say so: %+v %v", ex, err)
		}
	})
}

func runOKLang(t *testing.T, c *client.Client, id, lang, code string) *client.CodeExecution {
	t.Helper()
	ex, err := c.RunCode(ctxT(t), id, client.RunCodeRequest{Code: code, Language: lang})
	if err != nil || ex.Error != nil {
		t.Fatalf("%s %q: %+v %v", lang, code, ex, err)
	}
	return ex
}

func hasContext(list []client.CodeContext, id string) bool {
	for _, c := range list {
		if c.ID == id {
			return true
		}
	}
	return false
}

func isStatus(err error, status int) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == status
}

// TestCodeServerSuite runs the code-interpreter server's own test suite (test_server.py,
// embedded beside it) inside a real code-interpreter sandbox, against the installed server,
// as the sandbox's user: Debian's kernels under gVisor, not the host's.
func TestCodeServerSuite(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	id := create(t, c, client.CreateSandboxRequest{Template: "code-interpreter", Resources: &client.Resources{MemoryMiB: 2048}}).ID
	if _, err := c.Upload(ctx, id, "/home/user/test_server.py", bytes.NewReader(codeserver.TestSuite()), nil); err != nil {
		t.Fatal(err)
	}
	long, cancel := context.WithTimeout(context.Background(), 16*time.Minute)
	defer cancel()
	res, err := c.Exec(long, id, client.ExecRequest{Cmd: []string{"python3", "-m", "unittest", "-v", "test_server"}, User: "user",
		Env: map[string]string{"SPACE_CODE_SERVER": codeserver.InstallDir + "/server.py", "SPACE_CODE_BENCH_N": "20"}, TimeoutSeconds: 900})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("test_server.py in the sandbox (exit %d):\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	if res.ExitCode != 0 || !strings.Contains(res.Stderr, "\nOK") {
		t.Fatalf("the server's suite failed in the sandbox (exit %d)", res.ExitCode)
	}
}
