// Package spacedtest starts the real spaced binary in a temporary home for end-to-end tests and
// benchmarks, and checks a host for anything an instance left behind (processes, netns, veths,
// mounts, nftables tables, cgroups, files). Imported by e2e tests and cmd/space-bench only.
package spacedtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/pkg/client"
)

// Options configure a Daemon.
type Options struct {
	Bin      string   // directory holding spaced, space-agent, runsc
	Home     string   // SPACE_HOME; a new temp dir if empty
	Instance string   // SPACE_INSTANCE; random if empty
	Listen   string   // SPACE_LISTEN; a free loopback port if empty
	Key      string   // SPACE_ADMIN_KEY; random if empty
	Env      []string // extra environment
	LogFile  string   // where spaced logs go; Home/spaced.log if empty
	// Netns, if set, is the path of a network namespace spaced runs in (entered with nsenter,
	// which changes nothing else); the client reaches it through a dialer in that namespace.
	Netns string
}

// Daemon is a running spaced.
type Daemon struct {
	Opts   Options
	URL    string
	Client *client.Client
	cmd    *exec.Cmd
	done   chan error
	logf   *os.File
}

// RandomHex returns n random bytes as hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// FreePort returns a loopback address with a port free right now.
func FreePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Start launches spaced and waits until it serves.
func Start(ctx context.Context, o Options) (*Daemon, error) {
	var err error
	if o.Bin == "" {
		return nil, errors.New("spacedtest: Bin is required")
	}
	if o.Home == "" {
		if o.Home, err = os.MkdirTemp("", "space-home-"); err != nil {
			return nil, err
		}
	}
	if o.Instance == "" {
		o.Instance = RandomHex(2)
	}
	if o.Listen == "" {
		if o.Listen, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if o.Key == "" {
		o.Key = "e2b_" + RandomHex(20)
	}
	if o.LogFile == "" {
		o.LogFile = filepath.Join(o.Home, "spaced.log")
	}
	d := &Daemon{Opts: o, URL: "http://" + o.Listen, done: make(chan error, 1)}
	if err := d.launch(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Daemon) launch(ctx context.Context) error {
	o := d.Opts
	logf, err := os.OpenFile(o.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(o.Bin, "spaced"), "serve")
	hc := http.DefaultClient
	if o.Netns != "" {
		cmd = exec.Command("nsenter", "--net="+o.Netns, "--", filepath.Join(o.Bin, "spaced"), "serve")
		hc = &http.Client{Transport: &http.Transport{DialContext: NetnsDialer(o.Netns)}}
	}
	cmd.Env = append(os.Environ(),
		"SPACE_HOME="+o.Home, "SPACE_LISTEN="+o.Listen, "SPACE_ADMIN_KEY="+o.Key,
		"SPACE_INSTANCE="+o.Instance, "SPACE_RUNSC="+filepath.Join(o.Bin, "runsc"),
		"SPACE_AGENT="+filepath.Join(o.Bin, "space-agent"),
		// No code-interpreter pool unless the caller asks (o.Env wins): each member is a Python
		// and a Node kernel, and one still starting when the test stops spaced stays behind
		// until a next start, which the leak checks would report.
		"SPACE_WARM_POOL_TEMPLATES=none")
	cmd.Env = append(cmd.Env, o.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start spaced: %w", err)
	}
	d.cmd, d.logf = cmd, logf
	d.done = make(chan error, 1)
	go func() { d.done <- cmd.Wait() }()
	c, err := client.New(d.URL, o.Key, client.WithHTTPClient(hc))
	if err != nil {
		return err
	}
	d.Client = c
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-d.done:
			d.done <- err
			return fmt.Errorf("spaced exited during start (%v); log:\n%s", err, d.Log())
		default:
		}
		if r, err := hc.Get(d.URL + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			d.Kill()
			return fmt.Errorf("spaced did not serve within 60s; log:\n%s", d.Log())
		}
		select {
		case <-ctx.Done():
			d.Kill()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// PID is spaced's process ID.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Log returns what spaced has logged so far.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.Opts.LogFile)
	return string(b)
}

// Stop stops spaced gracefully (SIGTERM) and waits for it.
func (d *Daemon) Stop() error {
	if d.cmd == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		d.cmd = nil
		d.logf.Close()
		if err != nil {
			// spaced's shutdown watchdog logs what every goroutine was doing: show it.
			log := d.Log()
			if i := strings.LastIndex(log, "shutdown did not finish"); i >= 0 {
				log = log[max(0, i-2000):]
			} else {
				log = log[max(0, len(log)-4000):]
			}
			return fmt.Errorf("spaced exited with %v after SIGTERM; its log ends:\n%s", err, log)
		}
		return nil
	case <-time.After(60 * time.Second):
		d.Kill()
		return errors.New("spaced did not stop within 60s of SIGTERM")
	}
}

// Kill stops spaced with SIGKILL, as a crash would.
func (d *Daemon) Kill() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Kill()
	<-d.done
	d.cmd = nil
	d.logf.Close()
}

// WaitExit waits up to timeout for spaced to exit by itself (a crash point) and returns how it
// ended; an error if it is still running then.
func (d *Daemon) WaitExit(timeout time.Duration) (*os.ProcessState, error) {
	if d.cmd == nil {
		return nil, errors.New("spaced is not running")
	}
	select {
	case <-d.done:
		ps := d.cmd.ProcessState
		d.cmd = nil
		d.logf.Close()
		return ps, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("spaced still running after %s", timeout)
	}
}

// Restart starts spaced again on the same home, port and key.
func (d *Daemon) Restart(ctx context.Context) error { return d.launch(ctx) }

// Leaks lists what instance (with state under home) has left on the host. Call it after the
// daemon stopped with no sandboxes; an empty list means clean.
func Leaks(instance, home string) []string {
	var out []string
	if b, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "space-"+instance+"-") {
				out = append(out, "netns "+strings.Fields(l)[0])
			}
		}
	}
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			if strings.HasPrefix(i.Name, "sp"+instance) {
				out = append(out, "link "+i.Name)
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) > 4 && (strings.HasPrefix(f[4], home+"/") || strings.Contains(f[4], "/space-"+instance+"-")) {
				out = append(out, "mount "+f[4])
			}
		}
	}
	// Loop devices of sandbox disks (disk.img under the home).
	if files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file"); len(files) > 0 {
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), home+"/") {
				out = append(out, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(f)))+" on "+strings.TrimSpace(string(b)))
			}
		}
	}
	if conn, err := nftables.New(); err == nil {
		if tables, err := conn.ListTables(); err == nil {
			for _, t := range tables {
				if t.Name == "space_"+instance {
					out = append(out, "nftables table space_"+instance)
				}
			}
		}
	}
	for _, p := range processesMentioning(home) {
		out = append(out, "process "+p)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/space-" + instance); len(m) > 0 {
		for _, dir := range m {
			out = append(out, "cgroup "+dir)
		}
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/space-" + instance + "*"); len(m) > 0 {
		for _, dir := range m {
			if !contains(out, "cgroup "+dir) {
				out = append(out, "cgroup "+dir)
			}
		}
	}
	if entries, err := os.ReadDir("/run/space/net"); err == nil {
		for _, e := range entries {
			if b, err := os.ReadFile(filepath.Join("/run/space/net", e.Name())); err == nil && strings.TrimSpace(string(b)) == instance {
				out = append(out, "lease /run/space/net/"+e.Name())
			}
		}
	}
	if entries, err := os.ReadDir(filepath.Join(home, "runtime", "gvisor", "sandboxes")); err == nil && len(entries) > 0 {
		out = append(out, fmt.Sprintf("%d sandbox directories under %s", len(entries), filepath.Join(home, "runtime", "gvisor", "sandboxes")))
	}
	// Checkpoints, scratch directories of snapshots and restores, and chunk store content
	// (snapshots are deleted by the test's cleanup; the chunks must go with them).
	for _, dir := range []string{"checkpoints", "forks", "work", "layers", "store/roots", "store/packs", "store/tmp"} {
		n := 0
		filepath.WalkDir(filepath.Join(home, dir), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n++
			}
			return nil
		})
		if n > 0 {
			out = append(out, fmt.Sprintf("%d files under %s", n, filepath.Join(home, dir)))
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// processesMentioning lists processes whose command line mentions s (runsc keeps its state
// under the home, so every runsc process of an instance names it).
func processesMentioning(s string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	self := fmt.Sprint(os.Getpid())
	for _, d := range dirs {
		if filepath.Base(d) == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
		if strings.Contains(cmd, s) {
			out = append(out, filepath.Base(d)+" "+cmd)
		}
	}
	return out
}

// InNetns runs fn on a thread that has entered the network namespace at path; sockets fn
// creates belong to that namespace for their whole life.
func InNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is never handed back to the scheduler: it dies with this goroutine.
		goruntime.LockOSThread()
		ns, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// NetnsDialer dials from inside the network namespace at path.
func NetnsDialer(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := InNetns(path, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
