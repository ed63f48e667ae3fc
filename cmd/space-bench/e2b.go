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
	dir, err := filepath.Abs("e2e/e2b")
	if err != nil {
		return 0, 0, err
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b-2.51.0")); err != nil {
		return 0, 0, fmt.Errorf("the E2B SDK is not installed: run `npm ci` in e2e/e2b: %w", err)
	}
	cmd := exec.CommandContext(ctx, "node", "bench.mjs", "2.51.0", fmt.Sprint(n))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+d.Opts.Key, "E2B_API_URL="+d.URL, "E2B_SANDBOX_URL="+d.URL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("node bench.mjs: %v: %s", err, out)
	}
	var r struct {
		MedianMS float64 `json:"median_ms"`
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return 0, 0, fmt.Errorf("node bench.mjs output %q: %w", out, err)
	}
	sdk = time.Duration(r.MedianMS * float64(time.Millisecond))

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
