package gvisor_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/runtime/gvisor"
	"github.com/space-sandbox/space/internal/runtime/runtimetest"
	"github.com/space-sandbox/space/internal/template"
	"github.com/space-sandbox/space/internal/testutil"
)

// host is the privileged test environment shared by the tests of one run: runsc, a minimal
// template, an agent, a base directory for driver state and a cgroup instance name.
type host struct {
	runsc    string
	rootfs   string
	agent    string // the stand-in agent
	base     string // each driver's StateDir is a directory below base
	instance string
	netSeq   atomic.Int32
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails
	return hex.EncodeToString(b)
}

func moduleRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// newHost prepares the environment; it skips unless privileged tests are enabled.
func newHost(t testing.TB) *host {
	testutil.RequiresRoot(t)
	root := moduleRoot(t)
	h := &host{instance: randHex(2), base: t.TempDir()}
	h.runsc = os.Getenv("SPACE_RUNSC")
	if h.runsc == "" {
		h.runsc = filepath.Join(root, "bin", "runsc")
	}
	if _, err := os.Stat(h.runsc); err != nil {
		t.Fatalf("runsc not found at %s (run `make build` or set SPACE_RUNSC): %v", h.runsc, err)
	}
	store, err := template.New(template.Config{Dir: filepath.Join(h.base, "templates")})
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := store.Ensure(t.Context(), "minimal")
	if err != nil {
		t.Fatal(err)
	}
	h.rootfs = tmpl.RootFS
	h.agent = writeStandInAgent(t, h.base)
	return h
}

// standInAgent is the init of the conformance suite's sandboxes: it keeps running and runs
// every script dropped into /run/spool in the background, so that test processes are
// descendants of init like the real agent's, not `runsc exec` sessions (which gVisor kills on
// restore). It makes the driver's tests independent of the real agent.
const standInAgent = `#!/bin/busybox sh
mkdir -p /run/spool
while :; do
	for f in /run/spool/*.sh; do
		[ -e "$f" ] || continue
		mv "$f" "$f.run"
		sh "$f.run" </dev/null >/dev/null 2>&1 &
	done
	sleep 0.05
done
`

func writeStandInAgent(t testing.TB, dir string) string {
	p := filepath.Join(dir, "stand-in-agent")
	if err := os.WriteFile(p, []byte(standInAgent), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// buildAgent builds cmd/space-agent, or returns "" if it does not exist or build yet.
func buildAgent(t testing.TB, root, dir string) string {
	if _, err := os.Stat(filepath.Join(root, "cmd", "space-agent")); err != nil {
		return ""
	}
	out := filepath.Join(dir, "space-agent")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/space-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Logf("./cmd/space-agent does not build: %v\n%s", err, b)
		return ""
	}
	return out
}

// startProcess hands cmd to the stand-in agent.
func (h *host) startProcess(ctx context.Context, id, cmd string) error {
	name := "/run/spool/" + randHex(4)
	out, err := h.exec(ctx, id, "/bin/sh", "-c", `printf '%s\n' "$1" > "$2.tmp" && mv "$2.tmp" "$2.sh"`, "sh", cmd, name)
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// testLogger sends the driver's log to the test's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (h *host) newDriver(t testing.TB) *gvisor.Driver {
	stateDir, err := os.MkdirTemp(h.base, "state-")
	if err != nil {
		t.Fatal(err)
	}
	d, err := gvisor.New(gvisor.Config{Runsc: h.runsc, StateDir: stateDir, Instance: h.instance, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// With every sandbox deleted, the driver leaves nothing at all.
		if left := h.leftovers(stateDir, ""); len(left) > 0 {
			t.Errorf("driver left behind:\n  %s", strings.Join(left, "\n  "))
		}
	})
	return d
}

// newNetwork creates a netns with lo up and a veth pair whose both ends stay inside it, eth0
// holding a TEST-NET-1 address: no packet can leave the namespace.
func (h *host) newNetwork(t testing.TB) (runtime.Network, func()) {
	name := "sptest-" + randHex(4)
	n := h.netSeq.Add(1)
	guest := netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(2 + n%200)}), 24)
	cmds := [][]string{
		{"netns", "add", name},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"-n", name, "addr", "add", guest.String(), "dev", "eth0"},
		{"-n", name, "link", "set", "eth0", "up"},
		{"-n", name, "link", "set", "eth1", "up"},
	}
	cleanup := func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	}
	for i, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			if i > 0 {
				cleanup()
			}
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	return runtime.Network{
		NetNSPath: "/run/netns/" + name,
		Interface: "eth0",
		GuestIP:   guest,
		Gateway:   netip.AddrFrom4([4]byte{192, 0, 2, 1}),
	}, cleanup
}

// stateDirOf finds which driver state directory under base holds sandbox id.
func (h *host) stateDirOf(id string) (string, error) {
	m, _ := filepath.Glob(filepath.Join(h.base, "state-*", "sandboxes", id))
	if len(m) != 1 {
		return "", fmt.Errorf("sandbox %s: no state directory", id)
	}
	return filepath.Dir(filepath.Dir(m[0])), nil
}

// exec runs argv in sandbox id with `runsc exec`.
func (h *host) exec(ctx context.Context, id string, argv ...string) (string, error) {
	stateDir, err := h.stateDirOf(id)
	if err != nil {
		return "", err
	}
	args := append([]string{"--root=" + filepath.Join(stateDir, "runsc"), "exec", id}, argv...)
	out, err := exec.CommandContext(ctx, h.runsc, args...).CombinedOutput()
	return string(out), err
}

// writeFile writes data to path in sandbox id, from the stdin of `runsc exec`.
func (h *host) writeFile(ctx context.Context, id, path string, data []byte) error {
	stateDir, err := h.stateDirOf(id)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, h.runsc, "--root="+filepath.Join(stateDir, "runsc"), "exec", id,
		"/bin/sh", "-c", `cat > "$1"`, "sh", path)
	cmd.Stdin = bytes.NewReader(data)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("write %s: %v: %s", path, err, out)
	}
	return nil
}

// readFile reads path in sandbox id.
func (h *host) readFile(ctx context.Context, id, path string) ([]byte, error) {
	stateDir, err := h.stateDirOf(id)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, h.runsc, "--root="+filepath.Join(stateDir, "runsc"), "exec", id, "/bin/cat", path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("read %s: %v: %s", path, err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// pause leaves sandbox id paused with `runsc pause`, as a crash of spaced mid-freeze would.
func (h *host) pause(ctx context.Context, id string) error {
	stateDir, err := h.stateDirOf(id)
	if err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, h.runsc, "--root="+filepath.Join(stateDir, "runsc"), "pause", id).CombinedOutput(); err != nil {
		return fmt.Errorf("runsc pause %s: %v: %s", id, err, out)
	}
	return nil
}

// leftovers lists what exists on the host for sandbox id of the driver at stateDir, or for any
// sandbox of it when id is empty: processes, mounts, cgroups and files. It is written apart from
// the driver's own cleanup code, on purpose.
func (h *host) leftovers(stateDir, id string) []string {
	var out []string
	rootFlag := "--root=" + filepath.Join(stateDir, "runsc")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		hasRoot, hasID := false, id == ""
		for _, a := range args {
			hasRoot = hasRoot || a == rootFlag
			hasID = hasID || a == id
		}
		if hasRoot && hasID {
			out = append(out, "process "+filepath.Base(filepath.Dir(p))+": "+strings.Join(args, " "))
		}
	}
	prefix := stateDir
	if id != "" {
		prefix = filepath.Join(stateDir, "sandboxes", id)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.SplitSeq(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == prefix || strings.HasPrefix(f[4], prefix+"/")) {
			out = append(out, "mount "+f[4])
		}
	}
	cg := filepath.Join("space-"+h.instance, id)
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, hier := range append(hierarchies, "/sys/fs/cgroup") {
		if _, err := os.Stat(filepath.Join(hier, cg)); err == nil {
			out = append(out, "cgroup "+filepath.Join(hier, cg))
		}
	}
	if id != "" {
		for _, p := range []string{filepath.Join(stateDir, "sandboxes", id), filepath.Join(stateDir, "logs", id)} {
			if _, err := os.Lstat(p); err == nil {
				out = append(out, "file "+p)
			}
		}
	} else if entries, _ := os.ReadDir(filepath.Join(stateDir, "sandboxes")); len(entries) > 0 {
		out = append(out, fmt.Sprintf("files: %d sandbox directories", len(entries)))
	}
	return out
}

func (h *host) env() runtimetest.Env {
	return runtimetest.Env{
		RootFS:       h.rootfs,
		AgentPath:    h.agent,
		NewNetwork:   func(t *testing.T) (runtime.Network, func()) { return h.newNetwork(t) },
		Exec:         h.exec,
		StartProcess: h.startProcess,
		WriteFile:    h.writeFile,
		ReadFile:     h.readFile,
		Pause:        h.pause,
		Leftovers: func(t *testing.T, id string) []string {
			// Deleted sandboxes have no directory left to find the state dir by: check all.
			dirs, _ := filepath.Glob(filepath.Join(h.base, "state-*"))
			var out []string
			for _, sd := range dirs {
				out = append(out, h.leftovers(sd, id)...)
			}
			return out
		},
	}
}

func TestConformance(t *testing.T) {
	h := newHost(t)
	runtimetest.Run(t, func(t *testing.T) runtime.Driver { return h.newDriver(t) }, h.env())
}

// sandbox creates a sandbox with a fresh netns and deletes both at the end of the test.
func (h *host) sandbox(t *testing.T, d *gvisor.Driver, res runtime.Resources) runtime.Spec {
	t.Helper()
	netw, release := h.newNetwork(t)
	t.Cleanup(release)
	spec := runtime.Spec{
		ID: "gv-" + randHex(4), RootFS: h.rootfs, AgentPath: h.agent, AgentToken: "tok",
		Resources: res, Network: netw,
	}
	t.Cleanup(func() {
		if err := d.Delete(context.Background(), spec.ID); err != nil {
			t.Errorf("Delete: %v", err)
		}
	})
	if err := d.Create(t.Context(), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return spec
}

func mustExec(t *testing.T, h *host, id string, argv ...string) string {
	t.Helper()
	out, err := h.exec(t.Context(), id, argv...)
	if err != nil {
		t.Fatalf("exec %v: %v: %s", argv, err, out)
	}
	return out
}

// TestReadopt: a driver made later on the same StateDir (spaced restarted) sees, runs and
// deletes sandboxes of the earlier one.
func TestReadopt(t *testing.T) {
	h := newHost(t)
	first := h.newDriver(t)
	spec := h.sandbox(t, first, runtime.Resources{})
	stateDir, err := h.stateDirOf(spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	second, err := gvisor.New(gvisor.Config{Runsc: h.runsc, StateDir: stateDir, Instance: h.instance})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := second.State(t.Context(), spec.ID); err != nil || st != runtime.StateRunning {
		t.Fatalf("State from a new driver = %s, %v", st, err)
	}
	if ids, err := second.List(t.Context()); err != nil || len(ids) != 1 || ids[0] != spec.ID {
		t.Fatalf("List from a new driver = %v, %v", ids, err)
	}
	if err := second.Delete(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}
	if left := h.leftovers(stateDir, spec.ID); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestWritableLayerOnDisk: the sandbox's writes, /tmp included, land in its upper directory on
// the host; the agent's mount point does not.
func TestWritableLayerOnDisk(t *testing.T) {
	h := newHost(t)
	d := h.newDriver(t)
	spec := h.sandbox(t, d, runtime.Resources{})
	mustExec(t, h, spec.ID, "/bin/sh", "-c", "echo t > /tmp/in-tmp && echo r > /root/in-root")
	if out := mustExec(t, h, spec.ID, "/bin/cat", "/proc/mounts"); strings.Contains(out, "tmpfs /tmp ") {
		t.Errorf("/tmp is a tmpfs:\n%s", out)
	}
	stateDir, _ := h.stateDirOf(spec.ID)
	upper := filepath.Join(stateDir, "sandboxes", spec.ID, "upper")
	for p, want := range map[string]string{"tmp/in-tmp": "t\n", "root/in-root": "r\n"} {
		if b, err := os.ReadFile(filepath.Join(upper, p)); err != nil || string(b) != want {
			t.Errorf("upper/%s = %q, %v; want %q", p, b, err, want)
		}
	}
	// The template has the agent's mount point.
	if _, err := os.Lstat(filepath.Join(upper, ".space")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("agent mount point is in the writable layer: %v", err)
	}
	// The agent is mounted read-only, even for the sandbox's root.
	if out, err := h.exec(t.Context(), spec.ID, "/bin/sh", "-c", "echo x >> "+gvisor.AgentGuestPath); err == nil {
		t.Errorf("agent binary is writable: %s", out)
	}
}

// TestResourcesReachCgroups: limits from the spec are in the host cgroups, v1 or v2 (whichever
// the host has), defaults when zero.
func TestResourcesReachCgroups(t *testing.T) {
	h := newHost(t)
	d := h.newDriver(t)
	tests := []struct {
		name                string
		res                 runtime.Resources
		memory, quota, pids int64
	}{
		{"explicit", runtime.Resources{VCPUs: 2, MemoryMiB: 300, Pids: 500}, 314572800, 200000, 500*4 + 128},
		{"defaults", runtime.Resources{}, gvisor.DefaultMemoryMiB << 20, 100000, gvisor.DefaultPids*4 + 128},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := h.sandbox(t, d, tt.res)
			cg := testutil.CgroupOf(t, filepath.Join("space-"+h.instance, spec.ID))
			if got := cg.MemoryLimit(t); got != tt.memory {
				t.Errorf("memory limit (v2 %v) = %d, want %d", cg.V2, got, tt.memory)
			}
			if quota, period := cg.CPUQuota(t); quota != tt.quota || period != 100000 {
				t.Errorf("cpu quota (v2 %v) = %d/%d, want %d/100000", cg.V2, quota, period, tt.quota)
			}
			if _, limit := cg.Pids(t); limit != tt.pids {
				t.Errorf("pids.max (v2 %v) = %d, want %d", cg.V2, limit, tt.pids)
			}
		})
	}
}

// TestOutlivesParent: runsc's processes are not children of the test (spaced) and are in
// another session, so a spaced exit or a signal to its process group leaves them running.
func TestOutlivesParent(t *testing.T) {
	h := newHost(t)
	d := h.newDriver(t)
	spec := h.sandbox(t, d, runtime.Resources{})
	stateDir, _ := h.stateDirOf(spec.ID)
	procs := h.leftovers(stateDir, spec.ID)
	n := 0
	for _, p := range procs {
		pid, ok := strings.CutPrefix(p, "process ")
		if !ok {
			continue
		}
		pid, _, _ = strings.Cut(pid, ":")
		stat, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			continue
		}
		// Fields after "(comm)": state ppid pgrp session.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		ppid, _ := strconv.Atoi(f[1])
		sid, _ := strconv.Atoi(f[3])
		mySID, _ := getsid()
		if ppid == os.Getpid() || sid == mySID {
			t.Errorf("runsc process %s: ppid %d, session %d; test pid %d session %d", pid, ppid, sid, os.Getpid(), mySID)
		}
		n++
	}
	if n < 2 {
		t.Errorf("found %d runsc processes for the sandbox, want sandbox and gofer: %v", n, procs)
	}
}

func getsid() (int, error) {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return strconv.Atoi(f[3])
}

// TestRuntimeDied: when the sandbox's processes die behind the driver's back, State reports
// stopped and Delete still cleans up everything.
func TestRuntimeDied(t *testing.T) {
	h := newHost(t)
	d := h.newDriver(t)
	spec := h.sandbox(t, d, runtime.Resources{})
	stateDir, _ := h.stateDirOf(spec.ID)
	for _, p := range h.leftovers(stateDir, spec.ID) {
		if pid, ok := strings.CutPrefix(p, "process "); ok {
			pid, _, _ = strings.Cut(pid, ":")
			n, _ := strconv.Atoi(pid)
			if proc, err := os.FindProcess(n); err == nil {
				proc.Kill()
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := d.State(t.Context(), spec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st == runtime.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("State = %s after killing the runtime, want stopped", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := d.Delete(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}
	if left := h.leftovers(stateDir, spec.ID); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestCheckpointDirRules: what Checkpoint and Restore refuse, and a damaged image failing late
// inside runsc without leaving anything behind.
func TestCheckpointDirRules(t *testing.T) {
	h := newHost(t)
	d := h.newDriver(t)
	spec := h.sandbox(t, d, runtime.Resources{})
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	if err := d.Checkpoint(t.Context(), spec.ID, full, runtime.CheckpointOptions{LeaveRunning: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Checkpoint into a non-empty dir: %v, want ErrInvalidArgument", err)
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := d.Checkpoint(t.Context(), spec.ID, dir, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"checkpoint.img", "gvisor-checkpoint.json", "space-agent", "upper"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("checkpoint lacks %s: %v", f, err)
		}
	}
	if st, err := d.State(t.Context(), spec.ID); err != nil || st != runtime.StateRunning {
		t.Errorf("after Checkpoint(leaveRunning) State = %s, %v", st, err)
	}
	mustExec(t, h, spec.ID, "/bin/true")

	// The checkpoint is not needed once Restore returns: restore a copy, remove the copy.
	netw0, release0 := h.newNetwork(t)
	defer release0()
	copyDir := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", dir, copyDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	fork := runtime.Spec{ID: "gv-" + randHex(4), RootFS: h.rootfs, AgentPath: h.agent, Network: netw0}
	t.Cleanup(func() { d.Delete(context.Background(), fork.ID) })
	if err := d.Restore(t.Context(), fork, copyDir); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(copyDir); err != nil {
		t.Fatal(err)
	}
	// Touch memory and files after the image is gone.
	if out := mustExec(t, h, fork.ID, "/bin/sh", "-c", "ps -o args; ls /.space; cat /etc/passwd"); !strings.Contains(out, "root:x:0:0") {
		t.Errorf("restored sandbox after removing its checkpoint: %s", out)
	}
	if err := d.Delete(t.Context(), fork.ID); err != nil {
		t.Fatal(err)
	}

	// Damage the memory image: runsc fails after the driver mounted and copied things.
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	netw, release := h.newNetwork(t)
	defer release()
	bad := runtime.Spec{ID: "gv-" + randHex(4), RootFS: h.rootfs, AgentPath: h.agent, Network: netw}
	if err := d.Restore(t.Context(), bad, dir); err == nil {
		d.Delete(t.Context(), bad.ID)
		t.Fatal("Restore from a damaged image succeeded")
	}
	stateDir, _ := h.stateDirOf(spec.ID)
	if left := h.leftovers(stateDir, bad.ID); len(left) > 0 {
		t.Errorf("failed Restore left: %v", left)
	}
}

// TestManySequential creates and deletes sandboxes in a row: nothing accumulates.
func TestManySequential(t *testing.T) {
	h := newHost(t)
	d := h.newDriver(t)
	netw, release := h.newNetwork(t)
	defer release()
	for i := range 5 {
		spec := runtime.Spec{ID: fmt.Sprintf("seq-%d-%s", i, randHex(2)), RootFS: h.rootfs, AgentPath: h.agent, Network: netw}
		if err := d.Create(t.Context(), spec); err != nil {
			t.Fatal(err)
		}
		if err := d.Delete(t.Context(), spec.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkCreateUntilExec measures Create until `runsc exec echo` succeeds, then Delete
// (reported separately).
func BenchmarkCreateUntilExec(b *testing.B) {
	h := newHost(b)
	d := h.newDriver(b)
	netw, release := h.newNetwork(b)
	defer release()
	var create, del time.Duration
	for i := 0; b.Loop(); i++ {
		spec := runtime.Spec{ID: fmt.Sprintf("bench-%d", i), RootFS: h.rootfs, AgentPath: h.agent, Network: netw}
		start := time.Now()
		if err := d.Create(b.Context(), spec); err != nil {
			b.Fatal(err)
		}
		waitEcho(b, h, spec.ID)
		create += time.Since(start)
		start = time.Now()
		if err := d.Delete(b.Context(), spec.ID); err != nil {
			b.Fatal(err)
		}
		del += time.Since(start)
	}
	b.ReportMetric(float64(create.Milliseconds())/float64(b.N), "ms/create+exec")
	b.ReportMetric(float64(del.Milliseconds())/float64(b.N), "ms/delete")
}

// BenchmarkPlainRunsc is the floor: `runsc run --detach` of a bare busybox bundle (no overlay,
// no cgroup limits, no agent copy) until `runsc exec echo` succeeds.
func BenchmarkPlainRunsc(b *testing.B) {
	h := newHost(b)
	netw, release := h.newNetwork(b)
	defer release()
	root := filepath.Join(b.TempDir(), "runsc")
	bundle := b.TempDir()
	// A real directory copy of the template: runsc needs a rootfs it may write to.
	if out, err := exec.Command("cp", "-a", h.rootfs, filepath.Join(bundle, "rootfs")).CombinedOutput(); err != nil {
		b.Fatalf("cp: %v: %s", err, out)
	}
	cfg := fmt.Sprintf(`{"ociVersion":"1.0.0","process":{"user":{"uid":0,"gid":0},"args":["/bin/sleep","1000000"],"env":["PATH=/bin"],"cwd":"/"},
"root":{"path":"rootfs"},"hostname":"plain","mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"network","path":%q}]}}`, netw.NetNSPath)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	flags := []string{"--root=" + root, "--network=sandbox", "--overlay2=none"}
	console, err := os.Create(filepath.Join(b.TempDir(), "console.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer console.Close()
	runsc := func(args ...string) error {
		// The sandbox inherits stdio: a pipe (CombinedOutput) would never reach EOF.
		cmd := exec.Command(h.runsc, append(flags, args...)...)
		cmd.Stdout, cmd.Stderr = console, console
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("runsc %v: %v (see %s)", args, err, console.Name())
		}
		return nil
	}
	b.Cleanup(func() {
		exec.Command("umount", "-l", filepath.Join(root, "null-netns")).Run()
	})
	var create, del time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("plain-%d", i)
		start := time.Now()
		if err := runsc("run", "--detach", "--bundle="+bundle, id); err != nil {
			b.Fatal(err)
		}
		if err := runsc("exec", id, "/bin/echo", "hi"); err != nil {
			b.Fatal(err)
		}
		create += time.Since(start)
		start = time.Now()
		runsc("kill", id, "KILL")
		if err := runsc("delete", "--force", id); err != nil {
			b.Fatal(err)
		}
		del += time.Since(start)
	}
	b.ReportMetric(float64(create.Milliseconds())/float64(b.N), "ms/create+exec")
	b.ReportMetric(float64(del.Milliseconds())/float64(b.N), "ms/delete")
}

// waitEcho retries `runsc exec id /bin/echo hi` until it prints hi.
func waitEcho(b *testing.B, h *host, id string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := h.exec(b.Context(), id, "/bin/echo", "hi")
		if err == nil && out == "hi\n" {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("exec echo: %v: %s", err, out)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRealAgent runs the real cmd/space-agent as the sandbox's init: it starts and listens on
// the agent port, and does so again after checkpoint and restore into another network slot.
func TestRealAgent(t *testing.T) {
	h := newHost(t)
	realAgent := buildAgent(t, moduleRoot(t), t.TempDir())
	if realAgent == "" {
		t.Skip("cmd/space-agent does not build yet")
	}
	d := h.newDriver(t)
	listening := func(id string) bool {
		port := fmt.Sprintf(":%d ", runtime.AgentPort)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			out, err := h.exec(t.Context(), id, "/bin/netstat", "-ltn")
			if err == nil && strings.Contains(out, port) {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return false
	}
	netw, release := h.newNetwork(t)
	defer release()
	spec := runtime.Spec{ID: "agent-" + randHex(4), RootFS: h.rootfs, AgentPath: realAgent, AgentToken: "secret", Network: netw}
	t.Cleanup(func() { d.Delete(context.Background(), spec.ID) })
	if err := d.Create(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	if !listening(spec.ID) {
		stateDir, _ := h.stateDirOf(spec.ID)
		console, _ := os.ReadFile(filepath.Join(stateDir, "sandboxes", spec.ID, "console.log"))
		t.Fatalf("agent does not listen on %d; console:\n%s", runtime.AgentPort, console)
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := d.Checkpoint(t.Context(), spec.ID, dir, runtime.CheckpointOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(t.Context(), spec.ID); err != nil {
		t.Fatal(err)
	}
	netw2, release2 := h.newNetwork(t)
	defer release2()
	restored := spec
	restored.ID, restored.Network = "agent-"+randHex(4), netw2
	t.Cleanup(func() { d.Delete(context.Background(), restored.ID) })
	if err := d.Restore(t.Context(), restored, dir); err != nil {
		t.Fatal(err)
	}
	if !listening(restored.ID) {
		t.Fatal("restored agent does not listen")
	}
	if out := mustExec(t, h, restored.ID, "/bin/sh", "-c", "ip -4 -o addr"); !strings.Contains(out, netw2.GuestIP.Addr().String()) {
		t.Errorf("restored sandbox does not have its new slot's address %s:\n%s", netw2.GuestIP.Addr(), out)
	}
	if err := d.Delete(t.Context(), restored.ID); err != nil {
		t.Fatal(err)
	}
}
