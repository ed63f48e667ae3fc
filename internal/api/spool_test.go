package api_test

import (
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/space-sandbox/space/internal/api"
)

// TestExecSpoolBounded: a command's output past the per-stream share is dropped with
// "truncated" (the command still finishes), concurrent floods share one byte budget, and
// nothing is left in the spool directory, which is the one configured.
func TestExecSpoolBounded(t *testing.T) {
	e := newEnv(t)
	id := e.create("")
	dir := t.TempDir()
	srv := httptest.NewServer(api.New(api.Config{Sandboxes: e.mgr, Keys: e.keys, SpoolDir: dir, SpoolBytes: 3 << 20, SpoolPerOutput: 1 << 20}))
	t.Cleanup(srv.Close)
	e.url = srv.URL

	x := e.exec(id, `{"command":"head -c 3000000 /dev/zero | tr '\\000' x; echo done >&2"}`)
	if len(x.Stdout) != 1<<20 || strings.Trim(x.Stdout, "x") != "" || x.Stderr != "done\n" || !x.Truncated || x.ExitCode != 0 {
		t.Fatalf("flood: %d bytes of stdout, stderr %q, truncated %v, exit %d", len(x.Stdout), x.Stderr, x.Truncated, x.ExitCode)
	}
	// Four floods at once may hold 4 MiB; the budget is 3 MiB in all.
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 4 {
		wg.Go(func() {
			r := e.do("POST", "/v1/sandboxes/"+id+"/exec", `{"command":"head -c 2000000 /dev/zero | tr '\\000' y; sleep 0.5"}`)
			var x struct{ Stdout string }
			r.json(t, &x)
			mu.Lock()
			total += len(x.Stdout)
			mu.Unlock()
		})
	}
	wg.Wait()
	if total > 3<<20 || total < 1<<20 {
		t.Errorf("four concurrent floods answered %d bytes with a 3 MiB budget", total)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Errorf("spool directory holds %v, %v", ents, err)
	}
	if m := string(e.do("GET", "/metrics", "").body); !strings.Contains(m, "space_exec_spool_bytes 0\n") || !strings.Contains(m, "space_exec_spool_limit_bytes 3145728\n") {
		t.Errorf("metrics:\n%s", m)
	}
	// With the budget back, a small command answers whole.
	if x := e.exec(id, `{"command":"echo hi"}`); x.Stdout != "hi\n" || x.Truncated {
		t.Errorf("after the floods: %+v", x)
	}
}
