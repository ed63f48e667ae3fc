// Command space-bench is `make bench`: it measures spaced against the raw floor (plain runsc on a
// busybox bundle) in the same run and prints medians and ratios. Needs root and the binaries of
// `make build` (SPACE_BIN, default ./bin).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

func main() {
	n := flag.Int("n", 20, "iterations per measurement")
	only := flag.String("only", "", `run one section: "egress", "e2b" or "code"`)
	flag.Parse()
	bin := os.Getenv("SPACE_BIN")
	if bin == "" {
		bin = "bin"
	}
	bin, _ = filepath.Abs(bin)
	var err error
	switch *only {
	case "":
		err = run(context.Background(), bin, *n, os.Stdout)
	case "e2b":
		var d *daemon
		if d, err = startDaemon(context.Background(), bin, os.Stdout, "SPACE_WARM_POOL=2"); err == nil {
			var sdk, native time.Duration
			if sdk, native, err = e2bBench(context.Background(), d.Daemon, *n); err == nil {
				fmt.Printf("E2B SDK create + run('echo hi'): %s; native API: %s; ratio %.2f×\n", ms(sdk), ms(native), float64(sdk)/float64(native))
			}
			d.stop()
		}
	case "code":
		var f codeFigures
		if f, err = codeBench(context.Background(), bin, *n, os.Stdout); err == nil {
			printCode(os.Stdout, f)
		}
	case "egress":
		var f egressFigures
		if f, err = egressBench(context.Background(), bin, *n, os.Stdout); err == nil {
			printEgress(os.Stdout, f, *n)
		}
	default:
		err = fmt.Errorf("-only %q: want egress, e2b or code", *only)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "space-bench: %v\n", err)
		os.Exit(1)
	}
}

type result struct {
	name          string
	median, floor time.Duration
	target        string
}

func run(ctx context.Context, bin string, n int, out io.Writer) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (runsc in root mode, network namespaces)")
	}
	fmt.Fprintf(out, "space-bench: %d iterations each; binaries from %s\n", n, bin)

	raw, err := newRawFloor(bin)
	if err != nil {
		return err
	}
	defer raw.close()
	fmt.Fprintln(out, "measuring raw floor: runsc run --detach + runsc exec echo …")
	rawTTI, err := raw.timeToInteractive(ctx, n)
	if err != nil {
		return fmt.Errorf("raw tti: %w", err)
	}
	fmt.Fprintln(out, "measuring raw floor: runsc exec echo …")
	rawExec, err := raw.execRoundTrip(ctx, n*2)
	if err != nil {
		return fmt.Errorf("raw exec: %w", err)
	}

	fmt.Fprintln(out, "measuring raw floor: runsc checkpoint + runsc restore …")
	rawCkpt, rawRestore, err := raw.checkpointRestore(ctx, n/2+1)
	if err != nil {
		return fmt.Errorf("raw checkpoint/restore: %w", err)
	}

	fmt.Fprintln(out, "starting spaced (warm pool of 2, the default) …")
	d, err := startDaemon(ctx, bin, out, "SPACE_WARM_POOL=2")
	if err != nil {
		return err
	}
	defer d.stop()
	c := d.Client
	fmt.Fprintln(out, "measuring spaced: POST create + first exec output, from the warm pool …")
	warmTTI, err := timeToInteractive(ctx, d.Daemon, n, 2, "")
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "measuring E2B SDK create + run('echo') against the native API, from the warm pool …")
	e2bSDK, e2bNative, err := e2bBench(ctx, d.Daemon, n/2+1)
	if err != nil {
		return fmt.Errorf("e2b: %w", err)
	}

	fmt.Fprintln(out, "starting spaced with SPACE_WARM_POOL=0 …")
	cold, err := startDaemon(ctx, bin, out, "SPACE_WARM_POOL=0")
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "measuring spaced: POST create + first exec output, cold …")
	coldTTI, err := timeToInteractive(ctx, cold.Daemon, n, 0, "minimal")
	if err != nil {
		cold.stop()
		return err
	}
	fmt.Fprintln(out, "measuring spaced: the same from the base template (building it first if needed) …")
	if err := waitTemplate(ctx, cold.Client, "base"); err != nil {
		cold.stop()
		return err
	}
	baseTTI, err := timeToInteractive(ctx, cold.Daemon, n, 0, "base")
	cold.stop()
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "measuring spaced: exec round trip (echo hi) …")
	// busybox's echo, as in the raw floor's bundle.
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		return err
	}
	var rt []time.Duration
	for i := range n*2 + 5 {
		t0 := time.Now()
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"echo", "hi"}})
		if err != nil || res.Stdout != "hi\n" {
			return fmt.Errorf("exec: %v %+v", err, res)
		}
		if i >= 5 { // warm-up
			rt = append(rt, time.Since(t0))
		}
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		return err
	}

	fmt.Fprintln(out, "measuring spaced: pause and resume …")
	pauses, resumes, err := pauseResume(ctx, c, n/2+1)
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "measuring spaced: fork of 1 and of 10 copies …")
	fork1, fork10, err := forkTimes(ctx, c, n/4+1)
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "measuring spaced: snapshots of a sandbox holding 32 MiB of new data, before and after a 1 KiB change …")
	snaps, err := snapshotTimes(ctx, d.Daemon, n/4+1)
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "measuring spaced: template build of a 3-step recipe, first and cached …")
	firstBuild, cachedBuild, err := buildTimes(ctx, c, n/4+1)
	if err != nil {
		return err
	}

	eg, err := egressBench(ctx, bin, n, out)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}

	code, err := codeBench(ctx, bin, n, out)
	if err != nil {
		return fmt.Errorf("code: %w", err)
	}

	fmt.Fprintln(out, "measuring spaced: 10 concurrent creates …")
	conc, ok, err := concurrentCreates(ctx, c, 10)
	if err != nil {
		return err
	}

	results := []result{
		{"time to interactive, warm pool (default)", median(warmTTI), median(rawTTI), "≤ 1.0×"},
		{"time to interactive, cold (SPACE_WARM_POOL=0)", median(coldTTI), median(rawTTI), "≤ 1.0×"},
		{"create + first output: base vs minimal (both cold)", median(baseTTI), median(coldTTI), "≤ 1.2×"},
		{"exec round trip (echo hi)", median(rt), median(rawExec), "≤ 0.25×"},
		{"pause (durable) vs runsc checkpoint", median(pauses), median(rawCkpt), ""},
		{"resume vs runsc restore", median(resumes), median(rawRestore), "≤ 1.5×"},
		{"fork, 1 copy vs runsc restore", median(fork1), median(rawRestore), "≤ 2.5×"},
		{"E2B SDK create + run('echo') vs native API", e2bSDK, e2bNative, ""},
		{"fork, 10 copies vs runsc restore", median(fork10), median(rawRestore), ""},
		{"restore (whole, full snapshot, 32 MiB) vs runsc restore", median(snaps.restoreFull), median(rawRestore), ""},
		{"create from a full snapshot (32 MiB) vs runsc restore", median(snaps.fromFull), median(rawRestore), ""},
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "| %-50s | %10s | %10s | %6s | %7s |\n", "measurement", "spaced", "raw floor", "ratio", "target")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 52), strings.Repeat("-", 12), strings.Repeat("-", 12), strings.Repeat("-", 8), strings.Repeat("-", 9))
	for _, r := range results {
		fmt.Fprintf(out, "| %-50s | %10s | %10s | %5.2f× | %7s |\n", r.name, ms(r.median), ms(r.floor), float64(r.median)/float64(r.floor), r.target)
	}
	fmt.Fprintf(out, "| %-50s | %10s | %10s | %5.2f× | %7s |\n", "cached rebuild vs first build (3 steps, minimal)", ms(median(cachedBuild)), ms(median(firstBuild)),
		float64(median(cachedBuild))/float64(median(firstBuild)), "≤ 0.3×")
	fmt.Fprintf(out, "| %-50s | %10s | %10s | %6s | %7s |\n", fmt.Sprintf("10 concurrent creates: %d/10 succeeded", ok), ms(conc), "", "", "all")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "snapshots of a minimal sandbox holding 32 MiB of new random data (medians of %d):\n", len(snaps.fullStored2))
	fmt.Fprintf(out, "| %-50s | %10s | %12s | %10s |\n", "snapshot", "took", "stored bytes", "stopped")
	fmt.Fprintf(out, "|%s|%s|%s|%s|\n", strings.Repeat("-", 52), strings.Repeat("-", 12), strings.Repeat("-", 14), strings.Repeat("-", 12))
	row := func(name string, took []time.Duration, stored []int64, stopped []time.Duration) {
		fmt.Fprintf(out, "| %-50s | %10s | %12d | %10s |\n", name, ms(median(took)), medianInt(stored), ms(median(stopped)))
	}
	row("filesystem, first", snaps.fsTook1, snaps.fsStored1, snaps.fsStopped1)
	row("filesystem, after a 1 KiB change", snaps.fsTook2, snaps.fsStored2, snaps.fsStopped2)
	row("full, first", snaps.fullTook1, snaps.fullStored1, snaps.fullStopped1)
	row("full, after a 1 KiB change", snaps.fullTook2, snaps.fullStored2, snaps.fullStopped2)
	fmt.Fprintf(out, "second full snapshot stores %.1f%% of the first (target ≤ 10%%)\n",
		100*float64(medianInt(snaps.fullStored2))/float64(medianInt(snaps.fullStored1)))
	printEgress(out, eg, n)
	printCode(out, code)
	fmt.Fprintf(out, "\nraw floor: %s; spaced: %s, minimal template, default resources\n", raw.describe(), "JSON/SSE over loopback HTTP")
	if ok != 10 {
		return fmt.Errorf("only %d of 10 concurrent creates succeeded", ok)
	}
	return nil
}

type daemon struct {
	*spacedtest.Daemon
	out io.Writer
}

func startDaemon(ctx context.Context, bin string, out io.Writer, env ...string) (*daemon, error) {
	// Built-in templates from a cache kept across runs (base takes minutes to build the first
	// time); override with SPACE_TEMPLATES_DIR.
	tdir := os.Getenv("SPACE_TEMPLATES_DIR")
	if tdir == "" {
		tdir = "/var/cache/space-test/templates"
	}
	env = append([]string{"SPACE_TEMPLATES_DIR=" + tdir}, env...)
	d, err := spacedtest.Start(ctx, spacedtest.Options{Bin: bin, Env: env})
	if err != nil {
		return nil, err
	}
	return &daemon{Daemon: d, out: out}, nil
}

// stop stops spaced, reports anything it left on the host and removes its home.
func (d *daemon) stop() {
	home := d.Opts.Home
	// A section that failed half-way leaves its sandboxes (they outlive spaced by design).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	if list, err := d.Client.ListSandboxes(ctx, client.ListSandboxesOptions{}); err == nil {
		for _, sb := range list {
			if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
				fmt.Fprintf(d.out, "WARNING: delete %s: %v\n", sb.ID, err)
			}
		}
	}
	cancel()
	if err := d.Stop(); err != nil {
		fmt.Fprintf(d.out, "WARNING: stop spaced: %v\n", err)
	}
	if leaks := spacedtest.Leaks(d.Opts.Instance, home); len(leaks) > 0 {
		fmt.Fprintf(d.out, "WARNING: left on the host: %v\n", leaks)
	}
	os.RemoveAll(home)
}

// timeToInteractive measures POST create + first exec output n times. With a warm pool it waits
// for the pool to hold warm sandboxes before each create, so every create is served from it.
func timeToInteractive(ctx context.Context, d *spacedtest.Daemon, n, warm int, template string) ([]time.Duration, error) {
	c := d.Client
	var out []time.Duration
	for range n {
		if warm > 0 {
			if err := waitWarm(ctx, d.URL, warm); err != nil {
				return nil, err
			}
		}
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: template})
		if err != nil {
			return nil, err
		}
		if err := firstOutput(ctx, c, sb.ID); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// waitTemplate creates and deletes one sandbox from template, so that it is built.
func waitTemplate(ctx context.Context, c *client.Client, template string) error {
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: template})
	if err != nil {
		return fmt.Errorf("template %s: %w", template, err)
	}
	return c.DeleteSandbox(ctx, sb.ID)
}

// waitWarm polls /metrics until the warm pool holds n sandboxes.
func waitWarm(ctx context.Context, url string, n int) error {
	want := fmt.Sprintf("space_warm_pool_ready %d\n", n)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/metrics", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(body), want) {
			return nil
		}
	}
	return fmt.Errorf("warm pool did not fill to %d within a minute", n)
}

// buildTimes builds a 3-step recipe n times from scratch (a new random first step each time, so
// nothing is cached) and, after each, once more unchanged (all cached); it returns both series.
func buildTimes(ctx context.Context, c *client.Client, n int) (first, cached []time.Duration, err error) {
	for i := range n {
		req := client.BuildTemplateRequest{Name: fmt.Sprintf("bench-%d", i), From: client.BuildFrom{Template: "minimal"}, Steps: []client.BuildStep{
			{Run: "mkdir -p /app && echo " + spacedtest.RandomHex(8) + " > /app/id"},
			{Run: "for i in 1 2 3 4 5 6 7 8; do echo line $i >> /app/data.txt; done"},
			{Copy: &client.CopyStep{Path: "/app/config.json", Content: `{"bench":true}`}},
		}}
		t0 := time.Now()
		if _, err := c.BuildTemplate(ctx, req, nil); err != nil {
			return nil, nil, err
		}
		first = append(first, time.Since(t0))
		t0 = time.Now()
		if _, err := c.BuildTemplate(ctx, req, nil); err != nil {
			return nil, nil, err
		}
		cached = append(cached, time.Since(t0))
		if err := c.DeleteTemplate(ctx, req.Name); err != nil {
			return nil, nil, err
		}
	}
	return first, cached, nil
}

// busySandbox is a minimal sandbox running a background process: the workload pause, resume
// and fork are measured on.
func busySandbox(ctx context.Context, c *client.Client) (*client.Sandbox, error) {
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		return nil, err
	}
	if _, err := c.ExecBackground(ctx, sb.ID, client.ExecRequest{Command: "sleep 100000"}); err != nil {
		c.DeleteSandbox(ctx, sb.ID)
		return nil, err
	}
	return sb, nil
}

// forkTimes forks a minimal sandbox running a background process into 1 and into 10 copies,
// n times each, deleting the copies after each fork.
func forkTimes(ctx context.Context, c *client.Client, n int) (one, ten []time.Duration, err error) {
	sb, err := busySandbox(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	defer c.DeleteSandbox(ctx, sb.ID)
	for _, count := range []int{1, 10} {
		for range n {
			t0 := time.Now()
			copies, err := c.ForkSandbox(ctx, sb.ID, count)
			if err != nil {
				return nil, nil, err
			}
			d := time.Since(t0)
			if count == 1 {
				one = append(one, d)
			} else {
				ten = append(ten, d)
			}
			for _, cp := range copies {
				if err := c.DeleteSandbox(ctx, cp.ID); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	return one, ten, nil
}

// snapshotFigures are the snapshot measurements.
type snapshotFigures struct {
	fsTook1, fsTook2, fullTook1, fullTook2             []time.Duration
	fsStopped1, fsStopped2, fullStopped1, fullStopped2 []time.Duration
	fsStored1, fsStored2, fullStored1, fullStored2     []int64
	restoreFull, fromFull                              []time.Duration
}

// snapshotTimes measures, n times on a new sandbox each: a filesystem snapshot after writing
// 32 MiB of random data and another after changing 1 KiB of it; then the same with full
// snapshots (on fresh data, so the first stores everything again); a whole restore from the
// second full snapshot and a sandbox made from it. How long the sandbox was stopped comes from
// spaced's log of each snapshot.
func snapshotTimes(ctx context.Context, d *spacedtest.Daemon, n int) (f snapshotFigures, err error) {
	c := d.Client
	change := "head -c 1024 /dev/urandom | dd of=/root/data bs=1024 seek=12345 conv=notrunc 2>/dev/null"
	take := func(id, kind string, took *[]time.Duration, stored *[]int64, stopped *[]time.Duration) (string, error) {
		t0 := time.Now()
		s, err := c.CreateSnapshot(ctx, id, kind, "")
		if err != nil {
			return "", err
		}
		*took = append(*took, time.Since(t0))
		*stored = append(*stored, s.StoredBytes)
		st, err := stoppedFor(d, s.ID)
		if err != nil {
			return "", err
		}
		*stopped = append(*stopped, st)
		return s.ID, nil
	}
	for range n {
		for _, kind := range []string{client.SnapshotFilesystem, client.SnapshotFull} {
			sb, err := busySandbox(ctx, c)
			if err != nil {
				return f, err
			}
			var ids []string
			err = func() error {
				if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "head -c 33554432 /dev/urandom > /root/data"}); err != nil || res.ExitCode != 0 {
					return fmt.Errorf("write data: %v %+v", err, res)
				}
				took1, stored1, stopped1 := &f.fsTook1, &f.fsStored1, &f.fsStopped1
				took2, stored2, stopped2 := &f.fsTook2, &f.fsStored2, &f.fsStopped2
				if kind == client.SnapshotFull {
					took1, stored1, stopped1 = &f.fullTook1, &f.fullStored1, &f.fullStopped1
					took2, stored2, stopped2 = &f.fullTook2, &f.fullStored2, &f.fullStopped2
				}
				id1, err := take(sb.ID, kind, took1, stored1, stopped1)
				if err != nil {
					return err
				}
				ids = append(ids, id1)
				if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: change}); err != nil || res.ExitCode != 0 {
					return fmt.Errorf("change data: %v %+v", err, res)
				}
				id2, err := take(sb.ID, kind, took2, stored2, stopped2)
				if err != nil {
					return err
				}
				ids = append(ids, id2)
				if kind != client.SnapshotFull {
					return nil
				}
				t0 := time.Now()
				if _, err := c.Restore(ctx, sb.ID, id2); err != nil {
					return err
				}
				f.restoreFull = append(f.restoreFull, time.Since(t0))
				t0 = time.Now()
				cp, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{FromSnapshot: id2})
				if err != nil {
					return err
				}
				f.fromFull = append(f.fromFull, time.Since(t0))
				return c.DeleteSandbox(ctx, cp.ID)
			}()
			c.DeleteSandbox(ctx, sb.ID)
			for _, id := range ids {
				c.DeleteSnapshot(ctx, id)
			}
			if err != nil {
				return f, err
			}
		}
	}
	return f, nil
}

// stoppedFor reads how long snapshot sid stopped its sandbox from spaced's log.
func stoppedFor(d *spacedtest.Daemon, sid string) (time.Duration, error) {
	for _, line := range strings.Split(d.Log(), "\n") {
		if !strings.Contains(line, "snapshot="+sid) {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "stopped="); ok {
				return time.ParseDuration(v)
			}
		}
	}
	return 0, fmt.Errorf("snapshot %s: no stopped= in spaced's log", sid)
}

func medianInt(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// pauseResume pauses and resumes one minimal sandbox running a background process n times.
func pauseResume(ctx context.Context, c *client.Client, n int) (pauses, resumes []time.Duration, err error) {
	sb, err := busySandbox(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	defer c.DeleteSandbox(ctx, sb.ID)
	for range n {
		t0 := time.Now()
		if _, err := c.PauseSandbox(ctx, sb.ID); err != nil {
			return nil, nil, err
		}
		pauses = append(pauses, time.Since(t0))
		t0 = time.Now()
		if _, err := c.ResumeSandbox(ctx, sb.ID); err != nil {
			return nil, nil, err
		}
		resumes = append(resumes, time.Since(t0))
	}
	return pauses, resumes, nil
}

// firstOutput runs echo over SSE and returns at its first stdout event.
func firstOutput(ctx context.Context, c *client.Client, id string) error {
	s, err := c.ExecEvents(ctx, id, client.ExecRequest{Cmd: []string{"echo", "hi"}})
	if err != nil {
		return err
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil {
			return err
		}
		if ev.Type == client.EventStdout {
			return nil
		}
	}
}

func concurrentCreates(ctx context.Context, c *client.Client, n int) (time.Duration, int, error) {
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make([]error, n)
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
			if err == nil {
				ids[i] = sb.ID
				err = firstOutput(ctx, c, sb.ID)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	ok := 0
	for i, err := range errs {
		if err == nil {
			ok++
		}
		if ids[i] != "" {
			if err := c.DeleteSandbox(ctx, ids[i]); err != nil {
				return wall, ok, err
			}
		}
	}
	return wall, ok, nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func ms(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

// rawFloor runs plain runsc on a busybox bundle.
type rawFloor struct {
	bin, dir, root, bundle string
}

func newRawFloor(bin string) (*rawFloor, error) {
	dir, err := os.MkdirTemp("", "space-bench-raw-")
	if err != nil {
		return nil, err
	}
	r := &rawFloor{bin: bin, dir: dir, root: filepath.Join(dir, "runsc"), bundle: filepath.Join(dir, "bundle")}
	rootfs := filepath.Join(r.bundle, "rootfs")
	for _, p := range []string{filepath.Join(rootfs, "bin"), filepath.Join(rootfs, "proc"), filepath.Join(rootfs, "dev"), filepath.Join(rootfs, "sys"), filepath.Join(rootfs, "tmp"), r.root} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), bb, 0o755); err != nil {
		return nil, err
	}
	for _, a := range []string{"sh", "echo", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			return nil, err
		}
	}
	spec := `{"ociVersion":"1.0.0","process":{"user":{"uid":0,"gid":0},"args":["/bin/sleep","1000000"],
"env":["PATH=/bin"],"cwd":"/"},"root":{"path":"rootfs","readonly":false},"hostname":"raw",
"mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/dev","type":"tmpfs","source":"tmpfs"},{"destination":"/sys","type":"sysfs","source":"sysfs"}],
"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"network"}]}}`
	if err := os.WriteFile(filepath.Join(r.bundle, "config.json"), []byte(spec), 0o644); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rawFloor) describe() string {
	return "`runsc --network=none` (root mode, systrap) on a busybox-static bundle"
}

func (r *rawFloor) runsc(ctx context.Context, args ...string) error {
	full := append([]string{"--root", r.root, "--network=none"}, args...)
	// A detached sandbox inherits runsc's stdio: a file, unlike a pipe, does not keep us waiting.
	logf, err := os.CreateTemp(r.dir, "runsc-out-")
	if err != nil {
		return err
	}
	defer os.Remove(logf.Name())
	defer logf.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(r.bin, "runsc"), full...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logf.Name())
		return fmt.Errorf("runsc %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (r *rawFloor) timeToInteractive(ctx context.Context, n int) ([]time.Duration, error) {
	var out []time.Duration
	for i := range n {
		id := fmt.Sprintf("bench-%s-%d", spacedtest.RandomHex(3), i)
		t0 := time.Now()
		if err := r.runsc(ctx, "run", "--detach", "--bundle", r.bundle, id); err != nil {
			return nil, err
		}
		if err := r.runsc(ctx, "exec", id, "/bin/echo", "hi"); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
		if err := r.remove(ctx, id); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (r *rawFloor) execRoundTrip(ctx context.Context, n int) ([]time.Duration, error) {
	id := "bench-exec-" + spacedtest.RandomHex(3)
	if err := r.runsc(ctx, "run", "--detach", "--bundle", r.bundle, id); err != nil {
		return nil, err
	}
	defer r.remove(ctx, id)
	var out []time.Duration
	for i := range n + 3 {
		t0 := time.Now()
		if err := r.runsc(ctx, "exec", id, "/bin/echo", "hi"); err != nil {
			return nil, err
		}
		if i >= 3 {
			out = append(out, time.Since(t0))
		}
	}
	return out, nil
}

// checkpointRestore checkpoints a running busybox container (a sleep) and restores it into a new
// container, n times.
func (r *rawFloor) checkpointRestore(ctx context.Context, n int) (ckpt, restore []time.Duration, err error) {
	for i := range n {
		id := fmt.Sprintf("bench-ck-%s-%d", spacedtest.RandomHex(3), i)
		if err := r.runsc(ctx, "run", "--detach", "--bundle", r.bundle, id); err != nil {
			return nil, nil, err
		}
		img := filepath.Join(r.dir, "img-"+id)
		t0 := time.Now()
		if err := r.runsc(ctx, "checkpoint", "--image-path="+img, id); err != nil {
			r.remove(ctx, id)
			return nil, nil, err
		}
		ckpt = append(ckpt, time.Since(t0))
		_ = r.remove(ctx, id)
		id2 := id + "-r"
		t0 = time.Now()
		if err := r.runsc(ctx, "restore", "--detach", "--image-path="+img, "--bundle", r.bundle, id2); err != nil {
			return nil, nil, err
		}
		restore = append(restore, time.Since(t0))
		if err := r.remove(ctx, id2); err != nil {
			return nil, nil, err
		}
		os.RemoveAll(img)
	}
	return ckpt, restore, nil
}

func (r *rawFloor) remove(ctx context.Context, id string) error {
	_ = r.runsc(ctx, "kill", id, "KILL")
	return r.runsc(ctx, "delete", "--force", id)
}

// close removes the floor's files, including the netns bind mount runsc --network=none makes.
func (r *rawFloor) close() {
	_ = syscall.Unmount(filepath.Join(r.root, "null-netns"), syscall.MNT_DETACH)
	os.RemoveAll(r.dir)
}

func printEgress(out io.Writer, eg egressFigures, n int) {
	fmt.Fprintln(out)
	fmt.Fprintf(out, "egress: HTTPS GET to an allowed host in a fake internet (python3 client): a fresh connection each (median of %d), 8 clients for 5 s, and one kept-alive connection (median of %d requests):\n", n, 10*n)
	fmt.Fprintf(out, "| %-44s | %10s | %10s | %8s | %12s | %10s |\n", "path", "latency", "added", "req/s", "keep-alive", "added")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 46), strings.Repeat("-", 12), strings.Repeat("-", 12), strings.Repeat("-", 10), strings.Repeat("-", 14), strings.Repeat("-", 12))
	row := func(name string, p egressPath, floor bool) {
		added, kaAdded := "", ""
		if !floor {
			added, kaAdded = fmt.Sprintf("%+.1f ms", p.latency-eg.direct.latency), fmt.Sprintf("%+.2f ms", p.keepalive-eg.direct.keepalive)
		}
		fmt.Fprintf(out, "| %-44s | %7.1f ms | %10s | %8.1f | %9.2f ms | %10s |\n", name, p.latency, added, p.rps, p.keepalive, kaAdded)
	}
	row("host, direct (the floor)", eg.direct, true)
	row("sandbox via gateway, intercepted (default)", eg.intercepted, false)
	row("sandbox via gateway, passthrough (spliced)", eg.passthrough, false)
}
