package e2e

// The sandbox-escape red team (docs/SECURITY.md): attempts from inside sandboxes (root inside)
// and from hostile images against the host and the control plane. Every attempt is judged by
// evidence on the host side — a canary token planted in a host file appearing inside a sandbox,
// in an API answer or in a tree under SPACE_HOME; a host file or directory changed; a host port
// or API reached; a setuid file or device node materialised on the host; a limit not holding —
// never by what the attacker reports. `make redteam` runs them all (SPACE_REDTEAM=full); without
// it, TestRedTeam runs a representative subset (part of `make test`). With SPACE_REDTEAM_REPORT
// set, the table of attempts is written there as Markdown.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// Attempt results.
const (
	rtHeld    = "held"
	rtEscaped = "ESCAPED"
	rtFailed  = "FAILED" // no escape seen, but the host side broke: a 5xx, a hang, a sandbox in error
)

type rtRow struct {
	Group, Name, Result, Evidence string
}

// redTeam holds one run's canaries and results.
type redTeam struct {
	full bool
	host string // a host directory the test owns: canaries and targets live here

	mu      sync.Mutex
	needles map[string][]byte // canary name → token that must never show up
	rows    []rtRow
}

func newRedTeam(t *testing.T) *redTeam {
	rt := &redTeam{full: os.Getenv("SPACE_REDTEAM") == "full", host: t.TempDir(), needles: map[string][]byte{}}
	// Everything below host must be reachable by a host-side path walk only: 0755.
	if err := os.Chmod(rt.host, 0o755); err != nil {
		t.Fatal(err)
	}
	return rt
}

// canary writes a host file host/name holding a fresh token (padded to size bytes if size > 0)
// and returns its path.
func (rt *redTeam) canary(t *testing.T, name string, size int) string {
	t.Helper()
	tok := "RTC-" + name + "-" + spacedtest.RandomHex(12)
	body := []byte(tok + "\n")
	if size > len(body) {
		body = append([]byte(tok), bytes.Repeat([]byte("."), size-len(tok)-1)...)
		body = append(body, '\n')
	}
	p := filepath.Join(rt.host, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, body, 0o644); err != nil {
		t.Fatal(err)
	}
	rt.needle(name, []byte(tok))
	return p
}

func (rt *redTeam) needle(name string, tok []byte) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.needles[name] = bytes.Clone(tok)
}

// allCanaries names every canary so far.
func (rt *redTeam) allCanaries() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var names []string
	for n := range rt.needles {
		names = append(names, n)
	}
	return names
}

// found returns the canaries among names whose token is in b.
func (rt *redTeam) found(b []byte, names ...string) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []string
	for _, n := range names {
		if tok, ok := rt.needles[n]; ok && len(tok) > 0 && bytes.Contains(b, tok) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// judge records one attempt: escape (evidence of an escape) wins over failure (the host side
// broke); neither means the boundary held. Escapes and failures fail t.
func (rt *redTeam) judge(t *testing.T, group, name, escape, failure, note string) {
	t.Helper()
	row := rtRow{Group: group, Name: group + "/" + name, Result: rtHeld, Evidence: note}
	switch {
	case escape != "":
		row.Result, row.Evidence = rtEscaped, escape
		t.Errorf("attempt %s ESCAPED: %s", row.Name, escape)
	case failure != "":
		row.Result, row.Evidence = rtFailed, failure
		t.Errorf("attempt %s FAILED: %s", row.Name, failure)
	}
	rt.mu.Lock()
	rt.rows = append(rt.rows, row)
	rt.mu.Unlock()
}

// report prints the table (lines start with REDTEAM, which `make redteam` keeps) and writes it
// as Markdown to SPACE_REDTEAM_REPORT if set.
func (rt *redTeam) report(t *testing.T) {
	rt.mu.Lock()
	rows := append([]rtRow(nil), rt.rows...)
	rt.mu.Unlock()
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
	count := map[string]int{}
	width := 0
	for _, r := range rows {
		count[r.Result]++
		width = max(width, len(r.Name))
	}
	mode := "quick subset"
	if rt.full {
		mode = "full run"
	}
	fmt.Printf("REDTEAM %-*s | result\n", width, "attempt")
	for _, r := range rows {
		ev := r.Evidence
		if len(ev) > 160 {
			ev = ev[:157] + "..."
		}
		fmt.Printf("REDTEAM %-*s | %s %s\n", width, r.Name, r.Result, ev)
	}
	summary := fmt.Sprintf("%d attempts (%s): %d held, %d escaped, %d failed", len(rows), mode, count[rtHeld], count[rtEscaped], count[rtFailed])
	fmt.Printf("REDTEAM %s\n", summary)
	path := os.Getenv("SPACE_REDTEAM_REPORT")
	if path == "" {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s.\n\n| # | attempt | result | evidence |\n|---|---|---|---|\n", summary, time.Now().UTC().Format("2006-01-02"))
	for i, r := range rows {
		ev := strings.NewReplacer("|", `\|`, "\n", " ").Replace(r.Evidence)
		if len(ev) > 300 {
			ev = ev[:297] + "..."
		}
		fmt.Fprintf(&b, "| %d | `%s` | %s | %s |\n", i+1, r.Name, r.Result, ev)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Errorf("write report: %v", err)
	}
}

// TestRedTeam runs the escape attempts, group by group, and prints the table of results.
func TestRedTeam(t *testing.T) {
	binDir(t)
	rt := newRedTeam(t)
	t.Cleanup(func() { rt.report(t) })
	t.Run("files", func(t *testing.T) { rt.filesGroup(t) })
	t.Run("images", func(t *testing.T) { rt.imagesGroup(t) })
	t.Run("inside", func(t *testing.T) { rt.insideGroup(t) })
	t.Run("network", func(t *testing.T) { rt.networkGroup(t) })
	t.Run("resources", func(t *testing.T) { rt.resourcesGroup(t) })
	t.Run("credentials", func(t *testing.T) { rt.credentialsGroup(t) })
	t.Run("code", func(t *testing.T) { rt.codeGroup(t) })
}

// rtDaemon starts a spaced for the red team: no warm pool, a canary in its environment (what
// /proc/<spaced>/environ would disclose, with SPACE_ADMIN_KEY) and a key-shaped canary in
// SPACE_HOME/admin.key. Its secrets.key and egress-ca.key become canaries too.
func (rt *redTeam) rtDaemon(t *testing.T, env ...string) *spacedtest.Daemon {
	t.Helper()
	envTok := "RTC-environ-" + spacedtest.RandomHex(12)
	d := startSpaced(t, append([]string{"SPACE_WARM_POOL=0", "SPACE_REDTEAM_CANARY=" + envTok}, env...)...)
	rt.daemonCanaries(t, d, envTok)
	return d
}

func (rt *redTeam) daemonCanaries(t *testing.T, d *spacedtest.Daemon, envTok string) {
	t.Helper()
	home := d.Opts.Home
	rt.needle("environ", []byte(envTok))
	rt.needle("admin-key-env", []byte(d.Opts.Key))
	adminFile := "e2b_" + spacedtest.RandomHex(20)
	if err := os.WriteFile(filepath.Join(home, "admin.key"), []byte(adminFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rt.needle("admin.key", []byte(adminFile))
	for _, f := range []string{"secrets.key", "egress-ca.key"} {
		b, err := os.ReadFile(filepath.Join(home, f))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if f == "egress-ca.key" { // PEM: the base64 body is the secret
			if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) > 2 {
				b = []byte(lines[1])
			}
		}
		if len(bytes.TrimSpace(b)) < 16 {
			t.Fatalf("%s: too short to be a canary: %q", f, b)
		}
		rt.needle(f, bytes.TrimSpace(b))
	}
}

// ---- host-side evidence ----

// scanHome lists, per canary, the files under home (not following links, not through sandbox
// root mounts) that hold its token. The files that legitimately hold a canary are skipped.
func (rt *redTeam) scanHome(home string) map[string][]string {
	out := map[string][]string{}
	all := rt.allCanaries()
	skip := map[string]bool{"admin.key": true, "secrets.key": true, "egress-ca.key": true, "egress-ca.crt": true,
		"space.db": true, "space.db-wal": true, "space.db-shm": true, "spaced.log": true}
	filepath.WalkDir(home, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(home, p)
		if e.IsDir() && (e.Name() == "rootfs" || rel == "runsc" || rel == filepath.Join("runtime", "gvisor", "runsc")) {
			return filepath.SkipDir
		}
		if !e.Type().IsRegular() || skip[rel] {
			return nil
		}
		if fi, err := e.Info(); err != nil || fi.Size() > 64<<20 {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, n := range rt.found(b, all...) {
			out[n] = append(out[n], rel)
		}
		return nil
	})
	return out
}

// specialFiles lists what host code must never materialise under home: setuid or setgid files,
// device nodes (whiteouts, 0:0 character devices, excepted), fifos and sockets. Paths for which
// exclude is true are not looked at; under templates/ (read-only lower layers) set-id bits are
// only noted, not reported.
func specialFiles(home string, exclude func(rel string) bool) []string {
	var out []string
	filepath.WalkDir(home, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(home, p)
		if exclude != nil && exclude(rel) {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.IsDir() && (e.Name() == "rootfs" || rel == filepath.Join("runtime", "gvisor", "runsc")) {
			return filepath.SkipDir
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) != nil {
			return nil
		}
		inTemplates := strings.HasPrefix(rel, "templates/")
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			if st.Mode&syscall.S_ISUID != 0 && !inTemplates {
				out = append(out, "setuid "+rel)
			}
			if st.Mode&syscall.S_ISGID != 0 && !inTemplates {
				out = append(out, "setgid "+rel)
			}
		case syscall.S_IFCHR:
			if st.Rdev != 0 {
				out = append(out, fmt.Sprintf("chardev %d:%d %s", major(st.Rdev), minor(st.Rdev), rel))
			}
		case syscall.S_IFBLK:
			out = append(out, fmt.Sprintf("blockdev %d:%d %s", major(st.Rdev), minor(st.Rdev), rel))
		case syscall.S_IFIFO:
			out = append(out, "fifo "+rel)
		case syscall.S_IFSOCK:
			out = append(out, "socket "+rel)
		}
		return nil
	})
	return out
}

func major(dev uint64) uint64 { return (dev >> 8) & 0xfff }
func minor(dev uint64) uint64 { return (dev & 0xff) | ((dev >> 12) & 0xfff00) }

// treeDigest describes every entry under dir (type, mode, links, size, content hash or target)
// without following links or opening anything but regular files.
func treeDigest(dir string) map[string]string {
	out := map[string]string{}
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) != nil {
			return nil
		}
		sig := fmt.Sprintf("%o n%d s%d", st.Mode, st.Nlink, st.Size)
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			if b, err := os.ReadFile(p); err == nil {
				h := sha256.Sum256(b)
				sig += " " + hex.EncodeToString(h[:8])
			}
		case syscall.S_IFLNK:
			l, _ := os.Readlink(p)
			sig += " -> " + l
		case syscall.S_IFDIR:
			sig = fmt.Sprintf("%o", st.Mode) // a directory's size and links follow its entries
		}
		out[rel] = sig
		return nil
	})
	return out
}

// digestChanges lists what differs between two treeDigests.
func digestChanges(before, after map[string]string) []string {
	var out []string
	for p, a := range after {
		if b, ok := before[p]; !ok {
			out = append(out, "created "+p)
		} else if a != b {
			out = append(out, "changed "+p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			out = append(out, "removed "+p)
		}
	}
	sort.Strings(out)
	return out
}

// mountOpts returns the per-mount options of the mount at mountpoint ("" if none).
func mountOpts(mountpoint string) string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == mountpoint {
			return f[5]
		}
	}
	return ""
}

// missingMountFlags says which of flags the overlay root of sandbox id lacks ("" when it has
// them all, or is not mounted on the host).
func missingMountFlags(home, id string, flags ...string) string {
	opts := mountOpts(filepath.Join(home, "runtime", "gvisor", "sandboxes", id, "rootfs"))
	if opts == "" {
		return ""
	}
	have := map[string]bool{}
	for _, o := range strings.Split(opts, ",") {
		have[o] = true
	}
	var miss []string
	for _, f := range flags {
		if !have[f] {
			miss = append(miss, f)
		}
	}
	if len(miss) == 0 {
		return ""
	}
	return fmt.Sprintf("the overlay root of %s is mounted %s, without %s", id, opts, strings.Join(miss, ","))
}

// opFailure classifies an operation's error: "" for success or a 4xx refusal (hostile input
// refused), a failure otherwise (5xx, transport error, timeout).
func opFailure(err error) (failure, note string) {
	if err == nil {
		return "", ""
	}
	var ce *client.Error
	if errors.As(err, &ce) && ce.Status >= 400 && ce.Status < 500 {
		return "", fmt.Sprintf("refused: %d %s", ce.Status, trimTo(ce.Message, 120))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "hung: " + trimTo(err.Error(), 200), ""
	}
	return trimTo(err.Error(), 240), ""
}

func trimTo(s string, n int) string {
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}

// sh runs a shell command in a sandbox with a bound on its duration.
func sh(c *client.Client, id, command string, timeout time.Duration) (*client.ExecResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	return c.Exec(ctx, id, client.ExecRequest{Command: command, TimeoutSeconds: int(timeout / time.Second)})
}

// healthy reports why spaced or sandbox ids are unwell ("" when fine): spaced must answer and
// no sandbox may be in error.
func healthy(c *client.Client, ids ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Healthz(ctx); err != nil {
		return "spaced does not answer: " + err.Error()
	}
	for _, id := range ids {
		if id == "" {
			continue
		}
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			return fmt.Sprintf("sandbox %s: %v", id, err)
		}
		if sb.State == client.StateError {
			return fmt.Sprintf("sandbox %s is in error", id)
		}
	}
	return ""
}

func joinEv(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}
