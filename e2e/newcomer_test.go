package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// spaceCLI runs the real space binary in dir with env (and nothing of the test's SPACE_
// variables), stdin from stdin; it returns stdout, stderr and the exit status. A run that takes
// longer than a minute fails the test: a CLI that hangs is the bug.
func spaceCLI(t *testing.T, dir string, env []string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir(t), "space"), args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPACE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("space %s did not end in a minute (stdout %q, stderr %q)", strings.Join(args, " "), out.String(), errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestNewcomer walks what a new user of the CLI tripped on (issue 12): the README's template
// example, pip and venv in base, space shell with input from a file and with the user's login
// shell, space version, and the message of a CLI run where it finds no key.
func TestNewcomer(t *testing.T) {
	d := startSpaced(t)
	env := []string{"SPACE_URL=" + d.URL, "SPACE_API_KEY=" + d.Opts.Key}
	dir := t.TempDir()
	space := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		return spaceCLI(t, dir, env, stdin, args...)
	}

	// Both binaries come from one build: one version.
	out, errOut, code := space("", "version")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || errOut != "" || !strings.HasPrefix(lines[0], "space ") ||
		lines[1] != "spaced "+strings.TrimPrefix(lines[0], "space ")+" ("+d.URL+")" {
		t.Errorf("space version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	out, errOut, code = space("", "create")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sbx_") {
		t.Fatalf("create: %q %q %d", out, errOut, code)
	}

	// pip and venv are in base.
	if out, errOut, code := space("", "exec", id, "--", "pip", "--version"); code != 0 || !strings.Contains(out, "python 3") {
		t.Errorf("pip --version: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code := space("", "exec", id, "-c", "python3 -m venv /tmp/v && /tmp/v/bin/python -m pip --version"); code != 0 ||
		!strings.Contains(out, "/tmp/v/lib/python3") {
		t.Errorf("venv: exit %d, %q %q", code, out, errOut)
	}
	// pip install is not refused as an externally managed environment: it goes on to ask the
	// index, which this sandbox may not reach (egress denies all by default).
	if out, errOut, code := space("", "exec", id, "--", "pip", "install", "--no-index", "nonexistent-package-space"); code == 0 ||
		strings.Contains(out+errOut, "externally-managed-environment") || !strings.Contains(out+errOut, "No matching distribution") {
		t.Errorf("pip install: exit %d, %q %q", code, out, errOut)
	}

	// space shell with input at its end at once, and with a script: it ends with the shell, with
	// the shell's status, and the shell is the user's login shell (root's is bash in base).
	if out, errOut, code := space("", "shell", id); code != 0 {
		t.Errorf("shell </dev/null: exit %d, %q %q", code, out, errOut)
	}
	out, errOut, code = space("echo \"$0 $(id -un)\"\nshopt -q login_shell && echo login\nexit 7\n", "shell", id)
	if code != 7 || out != "/bin/bash root\nlogin\n" {
		t.Errorf("shell with a script: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if out, errOut, code := space("", "shell", id, "--", "sh", "-c", "cat; exit 4"); code != 4 || out != "" {
		t.Errorf("shell -- CMD: exit %d, %q %q", code, out, errOut)
	}

	// minimal (busybox): whatever its passwd says, a shell that runs the script.
	out, errOut, code = space("", "create", "--template", "minimal")
	small := strings.TrimSpace(out)
	if code != 0 {
		t.Fatalf("create minimal: %q %q", out, errOut)
	}
	if out, errOut, code := space("echo hi\nexit 3\n", "shell", small); code != 3 || out != "hi\n" {
		t.Errorf("shell in minimal: exit %d, %q %q", code, out, errOut)
	}

	// The README's own template example.
	out, errOut, code = space("", "template", "build", "app", "--from", "base", "--run", "pip list")
	if code != 0 {
		t.Errorf("template build --run 'pip list': exit %d, %q %q", code, out, errOut)
	} else if _, errOut, code := space("", "template", "rm", "app"); code != 0 {
		t.Errorf("template rm: %q", errOut)
	}

	// Run from a directory without .space and without a key: where it looked, and what to do.
	_, errOut, code = spaceCLI(t, dir, []string{"SPACE_URL=" + d.URL}, "", "ls")
	if want := "no file " + filepath.Join(dir, ".space", "admin.key"); code != 1 || !strings.Contains(errOut, want) ||
		!strings.Contains(errOut, "SPACE_API_KEY") {
		t.Errorf("no key: exit %d, stderr %q; want it to name %q", code, errOut, want)
	}

	if _, errOut, code := space("", "rm", id, small); code != 0 {
		t.Errorf("rm: %q", errOut)
	}
}
