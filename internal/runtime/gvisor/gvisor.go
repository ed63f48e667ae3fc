// Package gvisor is SPACE's default runtime driver: each sandbox is an OCI bundle run by gVisor's
// runsc, with the template as the lower layer of a host overlayfs whose upper layer (the
// sandbox's writable layer) lives on host disk. It implements runtime.Driver and
// runtime.Checkpointer. Its state lives under Config.StateDir so that sandboxes (runsc's sandbox
// and gofer processes, started in their own session) outlive spaced. Registered by cmd/spaced;
// it imports runtime and errdefs only.
//
// Layout under StateDir:
//
//	runsc/                    runsc --root (runsc's own state)
//	sandboxes/<id>/upper      writable layer (overlay upperdir)
//	sandboxes/<id>/work       overlay workdir
//	sandboxes/<id>/rootfs     overlay mount: the bundle's root
//	sandboxes/<id>/space-agent  private copy of the agent, bind-mounted read-only
//	sandboxes/<id>/config.json  OCI runtime spec (mode 0600: it holds the agent token)
//	sandboxes/<id>/console.log  stdout/stderr of runsc and of the agent
//	sandboxes/<id>/sandbox.json what the driver records about the sandbox (its template)
//	logs/<id>/                runsc debug logs, only with Config.Debug (kept after Delete)
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

// Name is the driver's registry name.
const Name = "gvisor"

// Resource defaults, used for zero fields of both Spec.Resources and Config.Defaults.
const (
	DefaultVCPUs     = 1
	DefaultMemoryMiB = 2048
	DefaultPids      = 4096
)

// Config configures a Driver.
type Config struct {
	Runsc    string // path of a statically linked runsc
	StateDir string // where all per-sandbox state and runsc's root live
	Instance string // short id of this spaced instance; cgroups are /space-<Instance>/<id>
	Platform string // runsc --platform; default "systrap"
	Debug    bool   // runsc debug logs under StateDir/logs/<id>/, kept after Delete
	// Defaults replaces zero fields of a Spec's Resources; its own zero fields mean the
	// package defaults (DefaultVCPUs, DefaultMemoryMiB, DefaultPids).
	Defaults runtime.Resources
	Logger   *slog.Logger
}

// Driver runs sandboxes with runsc. It keeps no per-sandbox state in memory: everything is read
// back from StateDir and runsc, so a new Driver on the same StateDir adopts earlier sandboxes.
type Driver struct {
	cfg       Config
	runscRoot string
	sandboxes string
	log       *slog.Logger
	// limitSwap: the host has swap and its cgroups account for it, so a sandbox's memory
	// limit must cover swap too (else memory_mib is exceeded into swap).
	limitSwap bool

	// mu orders making a sandbox directory against removing instance-wide leftovers (the
	// cgroup parent, runsc's shared null netns), which happens only when no sandbox is left.
	mu sync.Mutex

	// alive caches, per sandbox, the host process runsc last reported running it (ID →
	// procID): Alive reads /proc instead of running `runsc state`.
	alive sync.Map
}

// procID names one host process across PID reuse.
type procID struct {
	pid   int
	start string // field 22 of /proc/<pid>/stat: start time in clock ticks since boot
}

var (
	_ runtime.Driver        = (*Driver)(nil)
	_ runtime.LayerExporter = (*Driver)(nil)
	_ runtime.Checkpointer  = (*Driver)(nil)
	_ runtime.Thawer        = (*Driver)(nil)
	_ runtime.Prober        = (*Driver)(nil)
)

// validID matches the IDs the driver accepts: they name directories, cgroups and runsc
// containers.
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

var validInstance = regexp.MustCompile(`^[a-z0-9]{1,16}$`)

// New returns a driver, creating StateDir's layout if needed. It does not check that runsc runs;
// Available does.
func New(cfg Config) (*Driver, error) {
	if cfg.Runsc == "" || cfg.StateDir == "" {
		return nil, errdefs.InvalidArgument("gvisor: Runsc and StateDir are required")
	}
	if !validInstance.MatchString(cfg.Instance) {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("gvisor: instance %q: want 1-16 lowercase letters or digits", cfg.Instance))
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	for _, p := range []*string{&cfg.Runsc, &cfg.StateDir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
		*p = abs
	}
	d := &Driver{
		cfg:       cfg,
		runscRoot: filepath.Join(cfg.StateDir, "runsc"),
		sandboxes: filepath.Join(cfg.StateDir, "sandboxes"),
		log:       cfg.Logger.With("runtime", Name),
		limitSwap: swapAccounted(),
	}
	for _, dir := range []string{d.runscRoot, d.sandboxes} {
		//confine:host the driver's state directories
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	return d, nil
}

// Name implements runtime.Driver.
func (d *Driver) Name() string { return Name }

// Available implements runtime.Driver: root, overlayfs and a runsc that runs.
func (d *Driver) Available(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("gvisor: must run as root (runsc without --rootless, overlay mounts): %w", errdefs.ErrUnavailable)
	}
	//confine:host the host's /proc
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil || !bytes.Contains(fss, []byte("\toverlay\n")) {
		return fmt.Errorf("gvisor: kernel has no overlay filesystem: %w", errdefs.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, d.cfg.Runsc, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("gvisor: %s --version: %v: %s: %w", d.cfg.Runsc, err, bytes.TrimSpace(out), errdefs.ErrUnavailable)
	}
	return nil
}

// Create implements runtime.Driver.
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) error {
	return d.start(ctx, spec, "")
}

// start makes a sandbox's directory, writable layer and bundle, then runs runsc: `run`, or
// `restore` from checkpoint directory ckpt when it is not empty. On error it removes everything
// it made.
func (d *Driver) start(ctx context.Context, spec runtime.Spec, ckpt string) (err error) {
	if err := validateSpec(spec); err != nil {
		return err
	}
	sb := d.sandboxDir(spec.ID)
	d.mu.Lock()
	err = os.Mkdir(sb, 0o700)
	d.mu.Unlock()
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("gvisor: sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("gvisor: sandbox %s: %w", spec.ID, err)
	}
	defer func() {
		if err == nil {
			return
		}
		// Clean up even if ctx is what failed us.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if cerr := d.remove(cctx, spec.ID); cerr != nil {
			d.log.Error("cleanup after failed start", "id", spec.ID, "err", cerr)
		}
	}()
	start := time.Now()
	if err := d.prepare(ctx, spec, ckpt); err != nil {
		return fmt.Errorf("gvisor: sandbox %s: %w", spec.ID, err)
	}
	prepared := time.Since(start)
	args := []string{"run", "--detach", "--bundle=" + sb, spec.ID}
	if ckpt != "" {
		args = []string{"restore", "--detach", "--image-path=" + ckpt, "--bundle=" + sb, spec.ID}
	}
	if err := d.runDetached(ctx, spec.ID, args...); err != nil {
		return fmt.Errorf("gvisor: sandbox %s: %w", spec.ID, err)
	}
	d.log.InfoContext(ctx, "sandbox started", "id", spec.ID, "restored", ckpt != "",
		"prepare", prepared.Round(time.Millisecond), "total", time.Since(start).Round(time.Millisecond))
	return nil
}

// prepare builds the bundle: writable layer (seeded from ckpt/upper when restoring), the agent's
// private copy, the overlay mount and config.json.
func (d *Driver) prepare(ctx context.Context, spec runtime.Spec, ckpt string) error {
	sb := d.sandboxDir(spec.ID)
	if err := os.Mkdir(filepath.Join(sb, "rootfs"), 0o755); err != nil {
		return err
	}
	if mib := spec.Resources.DiskMiB; mib > 0 {
		if err := makeDisk(ctx, sb, mib); err != nil {
			return err
		}
	} else {
		for _, sub := range []string{"upper", "work"} {
			if err := os.Mkdir(filepath.Join(sb, sub), 0o755); err != nil {
				return err
			}
		}
	}
	upper, work := layerDirs(sb)
	agentDir, agentName := filepath.Split(spec.AgentPath)
	if ckpt != "" {
		if err := copyTree(filepath.Join(ckpt, "upper"), upper); err != nil {
			return fmt.Errorf("seed writable layer: %w", err)
		}
		// The checkpointed memory holds the agent that was running then; restore exactly it.
		agentDir, agentName = ckpt, agentFile
	}
	if err := writeResolvConf(filepath.Join(sb, resolvFile), spec.Network.Gateway); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	// A private copy: rebuilding the agent on the host never changes a running or checkpointed
	// sandbox's binary under it.
	if err := copyFile(agentDir, agentName, filepath.Join(sb, agentFile), 0o755); err != nil {
		return fmt.Errorf("copy agent: %w", err)
	}
	rootfs := filepath.Join(sb, "rootfs")
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,metacopy=off,redirect_dir=off",
		lowerDirs(spec), upper, work)
	// nosuid, nodev: nothing the sandbox or its image wrote is a set-id program or a device
	// on the host.
	if err := unix.Mount("overlay", rootfs, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", rootfs, err)
	}
	withBundle, err := writeCA(sb, rootfs, spec)
	if err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	if err := ensureMountPoints(rootfs, spec, withBundle); err != nil {
		return err
	}
	b, err := json.MarshalIndent(d.bundleSpec(spec, sb, withBundle), "", "  ")
	if err != nil {
		return err
	}
	//confine:host a file of the sandbox directory, which only the driver writes
	if err := os.WriteFile(filepath.Join(sb, "config.json"), b, 0o600); err != nil {
		return err
	}
	b, err = json.Marshal(sandboxInfo{RootFS: spec.RootFS, Layers: spec.Layers})
	if err != nil {
		return err
	}
	//confine:host a file of the sandbox directory, which only the driver writes
	return os.WriteFile(filepath.Join(sb, infoFile), b, 0o600)
}

// resolvFile is the sandbox's /etc/resolv.conf (bind-mounted read-only, so it is never part of
// its writable layer, snapshots or template layers built from it).
const resolvFile = "resolv.conf"

// writeResolvConf points the sandbox's resolver at its gateway. The file always has the same
// length: a restore into another slot mounts a file with another address in its place (any
// address would do, as every DNS packet a sandbox sends goes to the egress gateway).
func writeResolvConf(path string, gw netip.Addr) error {
	ns := "10.0.0.1"
	if gw.IsValid() {
		ns = gw.String()
	}
	body := fmt.Sprintf("nameserver %-15s\noptions attempts:2 timeout:2\n", ns)
	//confine:host a file of the sandbox directory, which only the driver writes
	return os.WriteFile(path, []byte(body), 0o644)
}

// infoFile in a sandbox directory records what the driver needs to know about the sandbox later
// (after a restart of spaced, at checkpoint time).
const infoFile = "sandbox.json"

type sandboxInfo struct {
	RootFS string   `json:"rootFS"`           // the template: lower layer of the overlay
	Layers []string `json:"layers,omitempty"` // further template layers over it, bottom to top
}

// lowerDirs is the overlayfs lowerdir option: the topmost layer first, RootFS last.
func lowerDirs(spec runtime.Spec) string {
	dirs := make([]string, 0, len(spec.Layers)+1)
	for i := len(spec.Layers) - 1; i >= 0; i-- {
		dirs = append(dirs, spec.Layers[i])
	}
	return strings.Join(append(dirs, spec.RootFS), ":")
}

func (d *Driver) readInfo(id string) (sandboxInfo, error) {
	var info sandboxInfo
	//confine:host a file of the sandbox directory, which only the driver writes
	b, err := os.ReadFile(filepath.Join(d.sandboxDir(id), infoFile))
	if err != nil {
		return info, err
	}
	return info, json.Unmarshal(b, &info)
}

// State implements runtime.Driver.
func (d *Driver) State(ctx context.Context, id string) (runtime.State, error) {
	if !validID.MatchString(id) {
		return "", errdefs.InvalidArgument(fmt.Sprintf("invalid sandbox ID %q", id))
	}
	status, known, err := d.runscState(ctx, id)
	if err != nil {
		return "", fmt.Errorf("gvisor: state of %s: %w", id, err)
	}
	if known {
		switch status {
		case "running":
			return runtime.StateRunning, nil
		case "paused":
			return runtime.StatePaused, nil
		default: // "creating", "created" (never started), "stopped"
			return runtime.StateStopped, nil
		}
	}
	//confine:host the sandbox directory itself
	if _, err := os.Lstat(d.sandboxDir(id)); err == nil {
		return runtime.StateStopped, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("gvisor: state of %s: %w", id, err)
	}
	return runtime.StateUnknown, nil
}

// Alive implements runtime.Prober: the sandbox process runsc last reported running still runs
// (same PID, same start time, not a zombie). Without such a report it asks runsc.
func (d *Driver) Alive(ctx context.Context, id string) bool {
	if v, ok := d.alive.Load(id); ok {
		p := v.(procID)
		if start, ok := procStart(p.pid); ok && start == p.start && !exited(p.pid) {
			return true
		}
		d.alive.Delete(id)
		return false
	}
	st, err := d.State(ctx, id)
	return err == nil && st == runtime.StateRunning
}

// Delete implements runtime.Driver.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if !validID.MatchString(id) {
		return errdefs.InvalidArgument(fmt.Sprintf("invalid sandbox ID %q", id))
	}
	d.alive.Delete(id)
	if err := d.remove(ctx, id); err != nil {
		return fmt.Errorf("gvisor: delete %s: %w", id, err)
	}
	return nil
}

// remove stops the sandbox and removes everything made for it: runsc's container, any process
// still running for it, mounts, the directory and cgroups. It tries every step and reports all
// failures.
func (d *Driver) remove(ctx context.Context, id string) error {
	sb := d.sandboxDir(id)
	var errs []error
	// Kill first: delete --force of a running container also kills, but a KILL of the init
	// ends the sandbox at once instead of after a stop timeout.
	if _, err := d.runsc(ctx, id, "kill", id, "KILL"); err != nil {
		d.log.DebugContext(ctx, "runsc kill", "id", id, "err", err)
	}
	if _, err := d.runsc(ctx, id, "delete", "--force", id); err != nil {
		if _, known, serr := d.runscState(ctx, id); serr != nil || known {
			errs = append(errs, err)
		}
	}
	if err := killSandboxProcs(ctx, d.runscRoot, id); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(ctx, sb); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(sb); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroups(ctx, d.cgroupParent(), id, true); err != nil {
		errs = append(errs, err)
	}
	d.removeInstanceLeftovers(ctx)
	return errors.Join(errs...)
}

// removeInstanceLeftovers removes what runsc shares between this instance's sandboxes once none
// is left: the cgroup parent and runsc's pinned "null" network namespace mount.
func (d *Driver) removeInstanceLeftovers(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	//confine:host the driver's sandboxes directory (names are sandbox IDs)
	entries, err := os.ReadDir(d.sandboxes)
	if err != nil || len(entries) > 0 {
		return
	}
	if err := removeCgroups(ctx, "/", d.cgroupParent(), false); err != nil {
		d.log.DebugContext(ctx, "cgroup parent not removed", "err", err)
	}
	// runsc pins a shared empty network namespace for its gofers at <root>/null-netns; it is a
	// cache that runsc recreates when missing. Concurrent runsc invocations may stack mounts.
	nullNS := filepath.Join(d.runscRoot, "null-netns")
	for unix.Unmount(nullNS, unix.MNT_DETACH) == nil {
	}
	if err := os.Remove(nullNS); err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.WarnContext(ctx, "remove null netns pin", "err", err)
	}
}

// List implements runtime.Driver.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	//confine:host the driver's sandboxes directory (names are sandbox IDs)
	entries, err := os.ReadDir(d.sandboxes)
	if err != nil {
		return nil, fmt.Errorf("gvisor: list: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && validID.MatchString(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids)
	return ids, nil
}

func (d *Driver) sandboxDir(id string) string { return filepath.Join(d.sandboxes, id) }

func (d *Driver) debugLogDir(id string) string { return filepath.Join(d.cfg.StateDir, "logs", id) }

// cgroupParent is this instance's cgroup under every hierarchy's root.
func (d *Driver) cgroupParent() string { return "/space-" + d.cfg.Instance }

func validateSpec(spec runtime.Spec) error {
	if !validID.MatchString(spec.ID) {
		return errdefs.InvalidArgument(fmt.Sprintf("invalid sandbox ID %q", spec.ID))
	}
	if !filepath.IsAbs(spec.RootFS) {
		return errdefs.InvalidArgument(fmt.Sprintf("rootfs %q is not an absolute path", spec.RootFS))
	}
	//confine:host the template root the lifecycle chose (a host path), not a path inside it
	if st, err := os.Stat(spec.RootFS); err != nil || !st.IsDir() {
		return errdefs.InvalidArgument(fmt.Sprintf("rootfs %q is not a directory", spec.RootFS))
	}
	if strings.ContainsAny(spec.RootFS, ",:") {
		return errdefs.InvalidArgument(fmt.Sprintf("rootfs %q: overlayfs cannot use a path with ',' or ':'", spec.RootFS))
	}
	for _, l := range spec.Layers {
		//confine:host a template layer the lifecycle chose (a host path), not a path inside it
		if st, err := os.Stat(l); err != nil || !st.IsDir() || !filepath.IsAbs(l) || strings.ContainsAny(l, ",:") {
			return errdefs.InvalidArgument(fmt.Sprintf("layer %q is not an absolute directory path overlayfs can use", l))
		}
	}
	//confine:host the agent binary on the host
	if st, err := os.Stat(spec.AgentPath); err != nil || !st.Mode().IsRegular() {
		return errdefs.InvalidArgument(fmt.Sprintf("agent %q is not a regular file", spec.AgentPath))
	}
	r := spec.Resources
	if r.VCPUs < 0 || r.MemoryMiB < 0 || r.Pids < 0 || r.DiskMiB < 0 {
		return errdefs.InvalidArgument("negative resource limit")
	}
	return nil
}

// runsc runs one short runsc command and returns its stdout; the error carries stderr.
func (d *Driver) runsc(ctx context.Context, id string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, d.cfg.Runsc, d.globalFlags(id)...)
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = runscEnv()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return stdout.Bytes(), &runscError{cmd: args[0], err: err, msg: msg}
	}
	return stdout.Bytes(), nil
}

type runscError struct {
	cmd string
	err error
	msg string
}

func (e *runscError) Error() string { return fmt.Sprintf("runsc %s: %v: %s", e.cmd, e.err, e.msg) }
func (e *runscError) Unwrap() error { return e.err }

// runDetached runs `runsc run --detach` or `runsc restore --detach`. runsc's sandbox and gofer
// processes inherit its stdio, so stdout and stderr go to console.log (a pipe would keep Wait
// waiting for the sandbox), and it starts a new session so nothing ties them to spaced.
func (d *Driver) runDetached(ctx context.Context, id string, args ...string) error {
	if d.cfg.Debug {
		//confine:host the driver's debug log directory
		if err := os.MkdirAll(d.debugLogDir(id), 0o700); err != nil {
			return err
		}
	}
	consolePath := filepath.Join(d.sandboxDir(id), "console.log")
	//confine:host the sandbox directory's console log, which only runsc and the driver write
	console, err := os.OpenFile(consolePath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer console.Close()
	var offset int64
	if st, err := console.Stat(); err == nil {
		offset = st.Size()
	}
	cmd := exec.CommandContext(ctx, d.cfg.Runsc, d.globalFlags(id)...)
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = runscEnv()
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return &runscError{cmd: args[0], err: err, msg: tail(consolePath, offset, 2048)}
	}
	return nil
}

// runscEnv is the whole environment of runsc and so of its sandbox and gofer processes, which
// outlive the command: nothing of spaced's own (its admin key, configuration) is handed down.
func runscEnv() []string { return []string{"PATH=" + defaultPath} }

// globalFlags are runsc's flags before the subcommand. --overlay2=none: the root's writes go
// through the gofer to our host overlay, so the writable layer is on disk, not in memory.
func (d *Driver) globalFlags(id string) []string {
	flags := []string{
		"--root=" + d.runscRoot,
		"--network=sandbox",
		"--overlay2=none",
		"--platform=" + d.cfg.Platform,
	}
	// Debug logs go to logs/<id>/, made by runDetached: commands about IDs that were never
	// started (State of an unknown ID) leave no log directory behind.
	if dir := d.debugLogDir(id); d.cfg.Debug {
		//confine:host the driver's debug log directory
		if _, err := os.Stat(dir); err == nil {
			flags = append(flags, "--debug", "--debug-log="+dir+"/")
		}
	}
	return flags
}

// runscState asks runsc about id; known is false when runsc has no container by that ID.
func (d *Driver) runscState(ctx context.Context, id string) (status string, known bool, err error) {
	out, err := d.runsc(ctx, id, "state", id)
	if err != nil {
		var re *runscError
		if errors.As(err, &re) && strings.Contains(re.msg, "does not exist") {
			return "", false, nil
		}
		return "", false, err
	}
	var st struct {
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", false, fmt.Errorf("runsc state: %w: %q", err, out)
	}
	// runsc probes its sandbox process with signal 0, which succeeds for a zombie; the
	// sandbox has exited (say after a checkpoint) but waits for an init that reaps slowly.
	if (st.Status == "running" || st.Status == "paused") && st.Pid > 0 && exited(st.Pid) {
		d.alive.Delete(id)
		return "stopped", true, nil
	}
	if st.Status == "running" && st.Pid > 0 {
		if start, ok := procStart(st.Pid); ok {
			d.alive.Store(id, procID{pid: st.Pid, start: start})
		}
	} else {
		d.alive.Delete(id)
	}
	return st.Status, true, nil
}

// tail returns up to n bytes of path from offset on: what runsc wrote about a failure.
func tail(path string, offset int64, n int64) string {
	//confine:host the sandbox directory's console log, which only runsc and the driver write
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	if st.Size()-offset > n {
		offset = st.Size() - n
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, offset, st.Size()-offset))
	return strings.TrimSpace(string(b))
}
