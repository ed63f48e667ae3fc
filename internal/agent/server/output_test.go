package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

func drain(t *testing.T, r *outputReader) []string {
	t.Helper()
	var out []string
	for {
		c, err := r.next(context.Background(), nil)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(c.data))
	}
}

func TestOutputLogLossyWindow(t *testing.T) {
	l := newOutputLog(8)
	for _, s := range []string{"aaaa", "bbbb", "cccc", "dd"} {
		l.write(outStdout, []byte(s), nil) // no lossless reader: never blocks
	}
	l.close()
	got := drain(t, l.reader(false))
	if strings.Join(got, "") != "ccccdd" {
		t.Fatalf("window = %q, want the most recent 8 bytes in whole chunks", got)
	}
	if n := l.retained(); n != 6 {
		t.Fatalf("retained %d", n)
	}
}

func TestOutputLogLosslessBlocksWriter(t *testing.T) {
	l := newOutputLog(8)
	r := l.reader(true)
	l.write(outStdout, []byte("aaaa"), nil)
	l.write(outStderr, []byte("bbbb"), nil)
	wrote := make(chan struct{})
	go func() {
		l.write(outStdout, []byte("cccc"), nil) // would drop "aaaa", which r has not read
		close(wrote)
	}()
	select {
	case <-wrote:
		t.Fatal("writer did not wait for the lossless reader")
	case <-time.After(50 * time.Millisecond):
	}
	c, err := r.next(context.Background(), nil)
	if err != nil || string(c.data) != "aaaa" || c.kind != outStdout {
		t.Fatalf("first chunk %q %v", c.data, err)
	}
	select {
	case <-wrote:
	case <-time.After(2 * time.Second):
		t.Fatal("writer still blocked after the reader advanced")
	}

	// A late lossy reader sees the window; it does not hold writers back.
	late := l.reader(false)
	l.close()
	if got := drain(t, r); len(got) != 2 || got[0] != "bbbb" || got[1] != "cccc" {
		t.Fatalf("lossless reader got %q", got)
	}
	if got := drain(t, late); len(got) != 2 {
		t.Fatalf("late reader got %q", got)
	}
}

func TestOutputLogReleaseUnblocksWriter(t *testing.T) {
	l := newOutputLog(4)
	r := l.reader(true)
	l.write(outStdout, []byte("aaaa"), nil)
	wrote := make(chan struct{})
	go func() { l.write(outStdout, []byte("bbbb"), nil); close(wrote) }()
	time.Sleep(20 * time.Millisecond)
	r.release()
	select {
	case <-wrote:
	case <-time.After(2 * time.Second):
		t.Fatal("release did not unblock the writer")
	}
	r.release() // idempotent
}

func TestOutputReaderIdleAndCancel(t *testing.T) {
	l := newOutputLog(16)
	r := l.reader(false)
	idle := make(chan time.Time, 1)
	idle <- time.Now()
	if _, err := r.next(context.Background(), idle); !errors.Is(err, errIdle) {
		t.Fatalf("idle: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.next(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: %v", err)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		l.write(outPTY, []byte("x"), nil)
	}()
	if c, err := r.next(context.Background(), nil); err != nil || c.kind != outPTY {
		t.Fatalf("wake on write: %v %v", c, err)
	}
}

func TestOutputLogCoalescesPendingChunksOfOneKind(t *testing.T) {
	l := newOutputLog(1 << 20)
	r := l.reader(true)
	for _, c := range []chunk{{outStdout, []byte("a")}, {outStdout, []byte("b")}, {outStderr, []byte("x")}, {outStdout, []byte("c")}} {
		l.write(c.kind, c.data, nil)
	}
	big := make([]byte, maxCoalesce)
	l.write(outStdout, big, nil)
	l.close()
	var got []string
	for {
		c, err := r.next(context.Background(), nil)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d:%d", c.kind, len(c.data)))
	}
	// "a"+"b" merge; stderr stays apart; "c" cannot take the full-size chunk along.
	want := []string{"1:2", "2:1", "1:1", fmt.Sprintf("1:%d", maxCoalesce)}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("chunks %v, want %v", got, want)
	}
}
