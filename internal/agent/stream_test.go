package agent_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/server"
)

// liveHeap returns the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// A command printing ~20 MB to a stream that is read slowly arrives whole, and the agent's
// memory stays bounded by its retention window rather than growing with the output.
func TestStartStreamLosslessWithSlowReader(t *testing.T) {
	const retention = 1 << 20
	const n = 2_700_000 // seq 1..n prints ~20 MB
	a := startAgent(t, func(c *server.Config) { c.OutputRetention = retention })

	var want bytes.Buffer
	for i := 1; i <= n; i++ {
		want.WriteString(strconv.Itoa(i))
		want.WriteByte('\n')
	}
	wantSum, wantLen := sha256.Sum256(want.Bytes()), want.Len()
	want = bytes.Buffer{}
	if wantLen < 20_000_000 {
		t.Fatalf("test output too small: %d", wantLen)
	}

	base := liveHeap()
	s, err := a.c.Start(testCtx(t), agent.ExecRequest{Argv: []string{"seq", "1", strconv.Itoa(n)}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := sha256.New()
	var got, peak uint64
	var msgs int
	start := time.Now()
	for {
		ev, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Kind {
		case agent.EventStdout:
			h.Write(ev.Data)
			got += uint64(len(ev.Data))
			msgs++
			if msgs%16 == 0 {
				time.Sleep(2 * time.Millisecond) // a slow consumer
			}
			if msgs%100 == 0 {
				if live := liveHeap(); live > peak {
					peak = live
				}
			}
		case agent.EventEnd:
			if ev.ExitCode != 0 {
				t.Fatalf("seq exit %d", ev.ExitCode)
			}
		}
	}
	if got != uint64(wantLen) || !bytes.Equal(h.Sum(nil), wantSum[:]) {
		t.Fatalf("received %d bytes (want %d), checksum match %v", got, wantLen, bytes.Equal(h.Sum(nil), wantSum[:]))
	}
	growth := int64(peak) - int64(base)
	t.Logf("%d bytes in %d messages, %v; live heap growth peak %d KiB", got, msgs, time.Since(start), growth>>10)
	// Output retained without bound would be ~20 MB live; the window is 1 MiB.
	if growth > 12<<20 {
		t.Fatalf("live heap grew by %d MiB while streaming", growth>>20)
	}
}

// A reader attached late with Connect gets at most the retained window: the most recent output.
func TestConnectReplayIsBoundedWindow(t *testing.T) {
	const retention = 64 << 10
	a := startAgent(t, func(c *server.Config) { c.OutputRetention = retention })
	ctx := testCtx(t)
	s, err := a.c.Start(ctx, agent.ExecRequest{Argv: []string{"seq", "1", "200000"}}) // ~1.3 MB
	if err != nil {
		t.Fatal(err)
	}
	pid := s.PID()
	s.Close() // nobody reads: the process must still run to completion (no backpressure)
	waitEnd(t, a.c, pid)
	cs, err := a.c.Connect(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, cs)
	if len(r.stdout) == 0 || len(r.stdout) > retention+32<<10 {
		t.Fatalf("replayed %d bytes, want (0, %d]", len(r.stdout), retention+32<<10)
	}
	if !bytes.HasSuffix([]byte(r.stdout), []byte("199999\n200000\n")) {
		t.Fatalf("replay does not end with the last lines: %q", r.stdout[max(0, len(r.stdout)-40):])
	}
	if r.end.ExitCode != 0 {
		t.Fatalf("exit %d", r.end.ExitCode)
	}
}
