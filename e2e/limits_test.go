package e2e

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testutil"
	"github.com/space-sandbox/space/pkg/client"
)

// sampler reads a cgroup value every 10 ms until stopped and keeps the highest it saw.
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	max  int64
	n    int
}

func sample(read func() (int64, bool)) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}), max: -1}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, ok := read(); ok {
				s.mu.Lock()
				s.max, s.n = max(s.max, v), s.n+1
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// end stops the sampler and returns the highest value and how many samples it read.
func (s *sampler) end() (int64, int) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max, s.n
}

// sandboxCgroup is the host cgroup of sandbox id of spaced instance, on v1 or v2.
func sandboxCgroup(t *testing.T, instance, id string) testutil.Cgroup {
	t.Helper()
	cg := testutil.CgroupOf(t, filepath.Join("space-"+instance, id))
	if !cg.Exists() {
		t.Fatalf("sandbox %s has no cgroup at %s", id, cg.File("memory", ""))
	}
	return cg
}

// ended reports whether err says the sandbox's runtime died under the command (503), and then
// checks that spaced marked it so.
func ended(t *testing.T, c *client.Client, id string, err error) bool {
	t.Helper()
	var apiErr *client.Error
	if err == nil || !errors.As(err, &apiErr) || apiErr.Status != 503 {
		return false
	}
	if got, gerr := c.GetSandbox(ctxT(t), id); gerr != nil || got.State != client.StateError {
		t.Fatalf("after the sandbox died: %+v, %v; want state error", got, gerr)
	}
	return true
}

// TestLimitsHold: memory and CPU limits are enforced by the sandbox's host cgroup, on whichever
// cgroup version the host has, and the pids limit inside the sandbox (the host cgroup behind
// it), against processes inside that try to exceed them.
func TestLimitsHold(t *testing.T) {
	d := startSpaced(t, "SPACE_WARM_POOL=0")
	c := d.Client

	t.Run("cpu", func(t *testing.T) {
		sb := create(t, c, client.CreateSandboxRequest{Template: "minimal", Resources: &client.Resources{VCPUs: 1, MemoryMiB: 256}})
		cg := sandboxCgroup(t, d.Opts.Instance, sb.ID)
		if q, p := cg.CPUQuota(t); q != 100000 || p != 100000 {
			t.Fatalf("cpu quota %d/%d µs, want 100000/100000", q, p)
		}
		// Three busy loops for 3 s want 3 CPUs; the quota gives one. Measured on the host, over
		// the command's whole run.
		before, start := cg.CPUUsage(t), time.Now()
		res, err := c.Exec(ctxT(t), sb.ID, client.ExecRequest{Command: "for i in 1 2 3; do (while :; do :; done) & done; sleep 3; kill $(jobs -p)", TimeoutSeconds: 20})
		wall, used := time.Since(start), cg.CPUUsage(t)-before
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("busy loops: %+v, %v", res, err)
		}
		share := used.Seconds() / wall.Seconds()
		t.Logf("1 vCPU: %.2fs of CPU in %.2fs (%.2f CPUs)", used.Seconds(), wall.Seconds(), share)
		// At most the quota (and a period's rounding); at least half of it, or the loops did not
		// run (the host has 2 cores, shared with other work).
		if share > 1.1 || share < 0.5 {
			t.Errorf("sandbox used %.2f CPUs with a 1-vCPU quota", share)
		}
	})

	t.Run("memory", func(t *testing.T) {
		const mib = 128
		sb := create(t, c, client.CreateSandboxRequest{Template: "minimal", Resources: &client.Resources{VCPUs: 1, MemoryMiB: mib}})
		cg := sandboxCgroup(t, d.Opts.Instance, sb.ID)
		if got := cg.MemoryLimit(t); got != mib<<20 {
			t.Fatalf("memory limit %d, want %d", got, mib<<20)
		}
		oomBefore := cg.OOMKills(t)
		peakName := "memory.peak"
		if !cg.V2 {
			peakName = "memory.max_usage_in_bytes"
		}
		usage := sample(func() (int64, bool) { return cg.Value("memory", peakName, "") })
		// awk doubles a string until it holds gigabytes: far past the limit, in seconds.
		res, err := c.Exec(ctxT(t), sb.ID, client.ExecRequest{Command: `awk 'BEGIN { s = "x"; while (1) s = s s }'; echo "exit $?"`, TimeoutSeconds: 60})
		peak, _ := usage.end()
		t.Logf("awk: %+v, %v; cgroup peak %d MiB", res, err, peak>>20)
		// The kernel charges memory a few pages ahead of the check (per-CPU stock).
		if peak > mib<<20+1<<20 {
			t.Errorf("cgroup peak %d bytes is over the %d MiB limit", peak, mib)
		}
		switch {
		case err == nil:
			// The host's OOM killer took the allocating process; the sandbox lives on.
			if !strings.Contains(res.Stdout, "exit 137") {
				t.Fatalf("awk was not killed: %+v", res)
			}
			if kills := cg.OOMKills(t); oomBefore >= 0 && kills <= oomBefore {
				t.Errorf("oom_kill count %d → %d: the cgroup limit did not act", oomBefore, kills)
			}
			if r := run(t, c, sb.ID, "echo alive"); r.Stdout != "alive\n" {
				t.Errorf("sandbox after the OOM kill: %+v", r)
			}
		case ended(t, c, sb.ID, err):
			// The OOM killer took the sandbox's kernel (gVisor has no OOM killer of its own).
			t.Log("the memory limit ended the sandbox")
		default:
			t.Fatalf("exec: %v", err)
		}
	})

	t.Run("pids", func(t *testing.T) {
		const pids = 64
		sb := create(t, c, client.CreateSandboxRequest{Template: "minimal", Resources: &client.Resources{VCPUs: 1, MemoryMiB: 1024, Pids: pids}})
		if sb.Resources == nil || sb.Resources.Pids != pids {
			t.Fatalf("resources %+v, want pids %d", sb.Resources, pids)
		}
		cg := sandboxCgroup(t, d.Opts.Instance, sb.ID)
		idle, limit := cg.Pids(t)
		// The host cgroup is the backstop: it counts the sandbox kernel's threads and about three
		// host tasks per guest task too.
		if limit != pids*4+128 {
			t.Fatalf("pids.max %d, want %d", limit, pids*4+128)
		}
		// Well under the limit, processes start and the sandbox runs on.
		if r := run(t, c, sb.ID, "for i in $(seq 10); do sleep 300 & done; sleep 0.2; pidof sleep | wc -w"); strings.TrimSpace(r.Stdout) != "10" {
			t.Fatalf("10 sleeps: %+v", r)
		}
		ten, _ := cg.Pids(t)
		t.Logf("host tasks: %d idle, %d with 10 sleeps; pids.max %d", idle, ten, limit)

		tasks := sample(func() (int64, bool) { return cg.Value("pids", "pids.current", "") })
		const loop = 1000
		res, err := c.Exec(ctxT(t), sb.ID, client.ExecRequest{
			Command:        fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep 4 & i=$((i+1)); done; echo started $i", loop),
			TimeoutSeconds: 60,
		})
		most, n := tasks.end()
		t.Logf("fork loop: %+v, %v; most host tasks seen %d (%d samples)", res, err, most, n)
		if err != nil {
			t.Fatalf("fork loop: %v", err)
		}
		if most > limit {
			t.Errorf("host cgroup held %d tasks, limit %d", most, limit)
		}
		// Forks past the limit fail inside with EAGAIN from the sandbox's own kernel.
		if strings.Contains(res.Stdout, "started") || !strings.Contains(res.Stderr, "Resource temporarily unavailable") {
			t.Fatalf("the fork loop was not stopped inside: %+v", res)
		}
		// The sandbox lives on: once the sleeps end, commands run again.
		deadline := time.Now().Add(30 * time.Second)
		for {
			r, err := c.Exec(ctxT(t), sb.ID, client.ExecRequest{Command: "echo alive"})
			if err == nil && r.Stdout == "alive\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the sandbox did not come back after the fork loop: %+v, %v", r, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	t.Run("beyond-the-host", func(t *testing.T) {
		// More CPUs or memory than the host has is refused, and nothing is made.
		before, _ := c.ListSandboxes(ctxT(t), client.ListSandboxesOptions{})
		for _, res := range []client.Resources{{VCPUs: 64}, {MemoryMiB: 262144}} {
			_, err := c.CreateSandbox(ctxT(t), client.CreateSandboxRequest{Template: "minimal", Resources: &res})
			var apiErr *client.Error
			if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Code != "invalid_argument" {
				t.Errorf("create with %+v: %v, want 400 invalid_argument", res, err)
			}
		}
		if after, _ := c.ListSandboxes(ctxT(t), client.ListSandboxesOptions{}); len(after) != len(before) {
			t.Errorf("refused creates changed the sandboxes: %d → %d", len(before), len(after))
		}
	})

	// Whatever the limits did to those sandboxes, spaced serves and new ones run.
	sb := create(t, c, client.CreateSandboxRequest{Template: "minimal"})
	if r := run(t, c, sb.ID, "echo fine"); r.Stdout != "fine\n" {
		t.Fatalf("a sandbox after the limit tests: %+v", r)
	}
}
