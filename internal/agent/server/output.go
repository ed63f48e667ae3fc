package server

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"
)

// outKind says which output a chunk came from.
type outKind uint8

const (
	outStdout outKind = iota + 1
	outStderr
	outPTY
)

type chunk struct {
	kind outKind
	data []byte
}

// maxCoalesce bounds the chunks that next merges into one.
const maxCoalesce = 256 << 10

// errIdle is returned by outputReader.next when the idle channel fired before any output.
var errIdle = errors.New("idle")

// outputLog is the combined output of one process: a window of the most recent chunks, numbered
// by sequence, at most limit bytes (plus one chunk).
//
// Readers come in two kinds. A lossless reader (the Start stream) pins the log: a writer that
// would have to drop a chunk the lossless reader has not read yet blocks instead, which stops
// the goroutine reading the process's pipe and so, through the full pipe, the process itself.
// Memory therefore stays bounded by limit whatever the reader's speed. A lossy reader (Connect,
// a late reader) never holds writers back: if it falls more than the window behind, it skips
// to the oldest retained chunk and misses the gap.
type outputLog struct {
	mu      sync.Mutex
	limit   int
	chunks  []chunk
	first   uint64 // sequence number of chunks[0]
	size    int    // bytes in chunks
	closed  bool
	wake    chan struct{} // closed and replaced when a chunk is added or the log closes
	space   chan struct{} // closed and replaced when a pinned reader advances or unpins
	waiting bool          // a writer waits on space
	pins    map[*outputReader]struct{}
}

func newOutputLog(limit int) *outputLog {
	return &outputLog{limit: limit, wake: make(chan struct{}), space: make(chan struct{}),
		pins: map[*outputReader]struct{}{}}
}

// write appends data (which the log takes over) as one chunk, blocking while a lossless reader
// still needs the chunks that would have to go. It returns early, dropping nothing, only if
// stop is closed.
func (l *outputLog) write(kind outKind, data []byte, stop <-chan struct{}) {
	l.mu.Lock()
	for l.size+len(data) > l.limit && len(l.chunks) > 0 {
		if l.pinnedAt(l.first) {
			l.waiting = true
			space := l.space
			l.mu.Unlock()
			select {
			case <-space:
			case <-stop:
				l.mu.Lock()
				l.waiting = false
				l.mu.Unlock()
				return
			}
			l.mu.Lock()
			continue
		}
		l.size -= len(l.chunks[0].data)
		l.chunks[0] = chunk{}
		l.chunks = l.chunks[1:]
		l.first++
	}
	l.chunks = append(l.chunks, chunk{kind: kind, data: data})
	l.size += len(data)
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
}

// pinnedAt reports whether a lossless reader has not yet read chunk seq.
func (l *outputLog) pinnedAt(seq uint64) bool {
	for r := range l.pins {
		if r.seq <= seq {
			return true
		}
	}
	return false
}

func (l *outputLog) signalSpaceLocked() {
	if l.waiting {
		l.waiting = false
		close(l.space)
		l.space = make(chan struct{})
	}
}

// close marks the end of output: readers get io.EOF once they have read everything retained.
func (l *outputLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.wake)
		l.wake = make(chan struct{})
	}
}

// discard drops every retained chunk (used to bound memory over finished processes).
func (l *outputLog) discard() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.size
	l.first += uint64(len(l.chunks))
	l.chunks, l.size = nil, 0
	return n
}

// retained reports how many bytes the log holds.
func (l *outputLog) retained() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size
}

// reader returns a reader from the oldest retained chunk. A lossless reader must be created
// before anything is written if it is to see everything.
func (l *outputLog) reader(lossless bool) *outputReader {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := &outputReader{log: l, seq: l.first, lossless: lossless}
	if lossless {
		l.pins[r] = struct{}{}
	}
	return r
}

type outputReader struct {
	log      *outputLog
	seq      uint64 // sequence number of the next chunk to read
	lossless bool
	skipped  uint64 // chunks missed because the reader fell behind (lossy only)
}

// next returns the next chunk. It returns io.EOF after the last chunk of a closed log, errIdle
// if idle fires first, or ctx's error.
func (r *outputReader) next(ctx context.Context, idle <-chan time.Time) (chunk, error) {
	l := r.log
	for {
		l.mu.Lock()
		if r.seq < l.first {
			r.skipped += l.first - r.seq
			r.seq = l.first
		}
		if idx := r.seq - l.first; idx < uint64(len(l.chunks)) {
			c := l.chunks[idx]
			r.seq++
			// Output that piled up while the reader was busy goes out as one chunk: a slow
			// stream then sends fewer, larger messages instead of falling further behind.
			if next := idx + 1; next < uint64(len(l.chunks)) && l.chunks[next].kind == c.kind && len(c.data) < maxCoalesce {
				merged := append(make([]byte, 0, min(maxCoalesce, l.size)), c.data...)
				for ; next < uint64(len(l.chunks)) && l.chunks[next].kind == c.kind && len(merged)+len(l.chunks[next].data) <= maxCoalesce; next++ {
					merged = append(merged, l.chunks[next].data...)
					r.seq++
				}
				c.data = merged
			}
			if r.lossless {
				l.signalSpaceLocked()
			}
			l.mu.Unlock()
			return c, nil
		}
		if l.closed {
			l.mu.Unlock()
			return chunk{}, io.EOF
		}
		wake := l.wake
		l.mu.Unlock()
		select {
		case <-wake:
		case <-idle:
			return chunk{}, errIdle
		case <-ctx.Done():
			return chunk{}, ctx.Err()
		}
	}
}

// release unpins a lossless reader so writers no longer wait for it. Idempotent.
func (r *outputReader) release() {
	l := r.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.pins[r]; ok {
		delete(l.pins, r)
		l.waiting = true // wake a writer unconditionally: its condition may now hold
		l.signalSpaceLocked()
	}
}
