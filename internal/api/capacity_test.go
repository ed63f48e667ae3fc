package api_test

import (
	"testing"

	"github.com/space-sandbox/space/internal/sandbox"
)

// TestCapacityRefused: a create that asks for more than the host has is a 400 that creates
// nothing; within the host's capacity, and with the defaults, it succeeds.
func TestCapacityRefused(t *testing.T) {
	host := sandbox.Capacity{VCPUs: 2, MemoryMiB: 1024, DiskMiB: 500, Pids: 1000}
	e := newEnv(t, func(c *sandbox.Config) {
		c.Capacity = func() (sandbox.Capacity, error) { return host, nil }
	})
	for _, body := range []string{
		`{"resources":{"vcpus":3}}`,
		`{"resources":{"memory_mib":2048}}`,
		`{"resources":{"disk_mib":1000}}`,
		`{"resources":{"pids":2000}}`,
		`{"resources":{"vcpus":2,"memory_mib":1024,"disk_mib":501}}`,
	} {
		wantError(t, e.do("POST", "/v1/sandboxes", body), 400, "invalid_argument")
	}
	var list struct{ Sandboxes []struct{ ID string } }
	e.do("GET", "/v1/sandboxes", "").json(t, &list)
	if len(list.Sandboxes) != 0 || len(e.pool.InUse()) != 0 {
		t.Fatalf("refused creates left %+v, %d slots", list, len(e.pool.InUse()))
	}
	e.create(`{"resources":{"vcpus":2,"memory_mib":1024,"disk_mib":500,"pids":1000}}`)
	e.create("") // the defaults are not checked against the host
}

func TestHostCapacity(t *testing.T) {
	c, err := sandbox.HostCapacity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if c.VCPUs < 1 || c.MemoryMiB < 64 || c.DiskMiB < 1 || c.Pids < 300 {
		t.Fatalf("host capacity %+v", c)
	}
	t.Logf("this host: %+v", c)
}
