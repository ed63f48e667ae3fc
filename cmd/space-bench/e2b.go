package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// e2bBench times create + first command through the unmodified E2B SDK (node, e2e/e2b) and the
// same through the native API (Go client), against one spaced with its warm pool, both from the
// default template and with a 300 ms pause between runs so the pool refills alike.
func e2bBench(ctx context.Context, d *spacedtest.Daemon, n int) (sdk, native time.Duration, err error) {
	if sdk, err = nodeMedian(ctx, d, "bench.mjs", "2.51.0", fmt.Sprint(n)); err != nil {
		return 0, 0, err
	}

	var times []time.Duration
	for i := range n + 2 {
		t0 := time.Now()
		sb, err := d.Client.CreateSandbox(ctx, client.CreateSandboxRequest{})
		if err != nil {
			return 0, 0, err
		}
		res, err := d.Client.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"/bin/bash", "-l", "-c", "echo hi"}})
		dt := time.Since(t0)
		if err != nil || res.Stdout != "hi\n" {
			return 0, 0, fmt.Errorf("native exec: %v %+v", err, res)
		}
		if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
			return 0, 0, err
		}
		if i >= 2 {
			times = append(times, dt)
		}
		time.Sleep(300 * time.Millisecond)
	}
	return sdk, median(times), nil
}

// nodeMedian runs a script of e2e/e2b (the E2B SDKs, pinned there) against d and returns the
// median it prints as its last line, {"median_ms": …}.
func nodeMedian(ctx context.Context, d *spacedtest.Daemon, script string, args ...string) (time.Duration, error) {
	dir, err := filepath.Abs("e2e/e2b")
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@e2b", "code-interpreter")); err != nil {
		return 0, fmt.Errorf("the E2B SDKs are not installed: run `npm ci` in e2e/e2b: %w", err)
	}
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+d.Opts.Key, "E2B_API_URL="+d.URL, "E2B_SANDBOX_URL="+d.URL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("node %s: %v: %s", script, err, out)
	}
	var r struct {
		MedianMS float64 `json:"median_ms"`
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return 0, fmt.Errorf("node %s output %q: %w", script, out, err)
	}
	return time.Duration(r.MedianMS * float64(time.Millisecond)), nil
}
