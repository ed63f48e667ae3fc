package gvisor_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/runtime/gvisor"
)

func TestScratch(t *testing.T) {
	h := newHost(t)
	sd := filepath.Join(h.base, "state-x")
	d, err := gvisor.New(gvisor.Config{Runsc: h.runsc, StateDir: sd, Instance: h.instance, Debug: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	spec := h.sandbox(t, d, runtime.Resources{})
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := d.Checkpoint(t.Context(), spec.ID, filepath.Join(t.TempDir(), "c"), false); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint %v", time.Since(start))
	t.Logf("logs in %s", sd)
	time.Sleep(100 * time.Second)
}
