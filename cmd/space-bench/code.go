package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// codeFigures are the code interpreter's measurements.
type codeFigures struct {
	viaSpaced, floor            time.Duration // run-code round trip of 1+1, warm kernel
	sdkFirst, nativeFirst       time.Duration // create + first runCode (SDK) / first exec (native), warm pools
	pause, resume               time.Duration // sandbox whose kernel holds a 200 MB DataFrame
	checkpointBytes, fullStored int64
}

// codeFloor runs in the sandbox: the same execute request, straight to the kernel over its
// ZeroMQ channels with jupyter_client (the newest ipykernel process is the context the bench
// made; its command line names its connection file), timed from the request until the reply
// and the kernel's idle status are in, as the server waits.
const codeFloor = `import json, os, statistics, sys, time
from jupyter_client import BlockingKernelClient
kernels = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
    except OSError:
        continue
    if b'ipykernel_launcher' in argv and b'-f' in argv:
        kernels.append((int(pid), argv[argv.index(b'-f') + 1].decode()))
cf = max(kernels)[1]
kc = BlockingKernelClient(connection_file=cf)
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=30)
n = int(sys.argv[1])
times = []
for i in range(n + 3):
    t0 = time.perf_counter()
    reply = kc.execute_interactive('1+1', timeout=30, output_hook=lambda m: None)
    dt = time.perf_counter() - t0
    assert reply['content']['status'] == 'ok', reply
    if i >= 3:
        times.append(dt)
kc.stop_channels()
print(json.dumps({'median_ms': statistics.median(times) * 1000}))
`

// codeBench measures the code interpreter on one spaced with warm pools of base and
// code-interpreter (one each).
func codeBench(ctx context.Context, bin string, n int, out io.Writer) (f codeFigures, err error) {
	fmt.Fprintln(out, "starting spaced with warm pools of base and code-interpreter (1 each) …")
	d, err := startDaemon(ctx, bin, out, "SPACE_WARM_POOL=1", "SPACE_WARM_POOL_TEMPLATES=code-interpreter=1")
	if err != nil {
		return f, err
	}
	defer d.stop()
	c := d.Client
	if err := waitWarm(ctx, d.URL, 2); err != nil {
		return f, err
	}

	fmt.Fprintln(out, "measuring the code interpreter: 1+1 through spaced, and straight to the kernel inside the sandbox …")
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "code-interpreter"})
	if err != nil {
		return f, err
	}
	cc, err := c.CreateCodeContext(ctx, sb.ID, "python", "")
	if err != nil {
		return f, err
	}
	var rt []time.Duration
	for i := range n*2 + 3 {
		t0 := time.Now()
		ex, err := c.RunCode(ctx, sb.ID, client.RunCodeRequest{Code: "1+1", ContextID: cc.ID})
		if err != nil || ex.Text() != "2" {
			return f, fmt.Errorf("run 1+1: %v %+v", err, ex)
		}
		if i >= 3 {
			rt = append(rt, time.Since(t0))
		}
	}
	f.viaSpaced = median(rt)
	if _, err := c.Upload(ctx, sb.ID, "/tmp/floor.py", strings.NewReader(codeFloor), nil); err != nil {
		return f, err
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"python3", "/tmp/floor.py", fmt.Sprint(n * 2)}, User: "user"})
	if err != nil || res.ExitCode != 0 {
		return f, fmt.Errorf("floor: %v %+v", err, res)
	}
	var floor struct {
		MedianMS float64 `json:"median_ms"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &floor); err != nil {
		return f, fmt.Errorf("floor output %q: %w", res.Stdout, err)
	}
	f.floor = time.Duration(floor.MedianMS * float64(time.Millisecond))

	fmt.Fprintln(out, "measuring the code interpreter: 200 MB DataFrame, pause and resume …")
	f.pause, f.resume, f.checkpointBytes, f.fullStored, err = bigFramePauseResume(ctx, d.Daemon, sb.ID, n/4+1)
	if err != nil {
		return f, err
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		return f, err
	}

	fmt.Fprintln(out, "measuring E2B code-interpreter SDK create + runCode('1+1') and native create + exec, warm pools …")
	f.sdkFirst, f.nativeFirst, err = firstRunCode(ctx, d.Daemon, n/2+1)
	return f, err
}

// bigFramePauseResume fills the kernel with a 200 MB DataFrame, then pauses and resumes the
// sandbox n times; it returns the medians, the checkpoint's size on disk, and what a full
// snapshot of it stores.
func bigFramePauseResume(ctx context.Context, d *spacedtest.Daemon, id string, n int) (pause, resume time.Duration, ckpt, stored int64, err error) {
	c := d.Client
	ex, err := c.RunCode(ctx, id, client.RunCodeRequest{Code: "import numpy as np, pandas as pd\n" +
		"big = pd.DataFrame(np.random.default_rng(1).random((2_500_000, 10)))\nint(big.memory_usage().sum() / 1e6)"})
	if err != nil || ex.Error != nil || ex.Text() != "200" {
		return 0, 0, 0, 0, fmt.Errorf("make the DataFrame: %v %+v", err, ex)
	}
	var ps, rs []time.Duration
	for range n {
		t0 := time.Now()
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			return 0, 0, 0, 0, err
		}
		ps = append(ps, time.Since(t0))
		ckpt = dirBytes(filepath.Join(d.Opts.Home, "checkpoints", id))
		t0 = time.Now()
		if _, err := c.ResumeSandbox(ctx, id); err != nil {
			return 0, 0, 0, 0, err
		}
		rs = append(rs, time.Since(t0))
		if ex, err := c.RunCode(ctx, id, client.RunCodeRequest{Code: "big.shape[0]"}); err != nil || ex.Text() != "2500000" {
			return 0, 0, 0, 0, fmt.Errorf("after resume: %v %+v", err, ex)
		}
	}
	snap, err := c.CreateSnapshot(ctx, id, client.SnapshotFull, "")
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer c.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID)
	return median(ps), median(rs), ckpt, snap.StoredBytes, nil
}

// dirBytes is the allocated size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// firstRunCode times, with the pools full before each run: Sandbox.create() and the first
// runCode('1+1') through the unmodified @e2b/code-interpreter (node, e2e/e2b; one process, two
// warm-up runs), and the native API's create of base and its first exec.
func firstRunCode(ctx context.Context, d *spacedtest.Daemon, n int) (sdk, native time.Duration, err error) {
	if sdk, err = nodeMedian(ctx, d, "bench-code.mjs", fmt.Sprint(n), "2"); err != nil {
		return 0, 0, err
	}
	var natives []time.Duration
	for i := range n + 2 {
		if err := waitWarm(ctx, d.URL, 2); err != nil {
			return 0, 0, err
		}
		t0 := time.Now()
		sb, err := d.Client.CreateSandbox(ctx, client.CreateSandboxRequest{})
		if err != nil {
			return 0, 0, err
		}
		res, err := d.Client.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"echo", "hi"}})
		dt := time.Since(t0)
		if err != nil || res.Stdout != "hi\n" {
			return 0, 0, fmt.Errorf("native exec: %v %+v", err, res)
		}
		if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
			return 0, 0, err
		}
		if i >= 2 { // warm-up
			natives = append(natives, dt)
		}
	}
	return sdk, median(natives), nil
}

func printCode(out io.Writer, f codeFigures) {
	fmt.Fprintln(out)
	fmt.Fprintf(out, "| %-58s | %10s | %10s | %6s | %7s |\n", "code interpreter", "measured", "floor", "ratio", "target")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 60), strings.Repeat("-", 12), strings.Repeat("-", 12), strings.Repeat("-", 8), strings.Repeat("-", 9))
	fmt.Fprintf(out, "| %-58s | %10s | %10s | %5.2f× | %7s |\n", "run-code 1+1 through spaced vs to the kernel inside", ms(f.viaSpaced), ms(f.floor), float64(f.viaSpaced)/float64(f.floor), "≤ 1.5×")
	fmt.Fprintf(out, "| %-58s | %10s | %10s | %5.2f× | %7s |\n", "SDK create + runCode vs native create + exec (warm)", ms(f.sdkFirst), ms(f.nativeFirst), float64(f.sdkFirst)/float64(f.nativeFirst), "")
	fmt.Fprintf(out, "200 MB DataFrame in the kernel: pause %s, resume %s, checkpoint %d MiB on disk, a full snapshot stores %d MiB\n",
		ms(f.pause), ms(f.resume), f.checkpointBytes>>20, f.fullStored>>20)
}
