package api

import (
	"fmt"
	"os"
	"sync/atomic"
)

// spool holds the output of commands whose answer is one JSON object while they run: files in
// one directory (under SPACE_HOME, so it counts against the installation's disk and not the
// host's /tmp), unlinked as soon as they are created so that nothing outlives the request or a
// crash, and a byte budget shared by every request. Output past a request's share or the
// budget is dropped and the answer says "truncated".
type spool struct {
	dir    string
	limit  int64 // bytes all spooled output may hold at once
	perOut int64 // bytes one output stream (stdout or stderr) of one command may hold
	used   atomic.Int64
}

func newSpool(dir string, limit, perOut int64) *spool {
	return &spool{dir: dir, limit: limit, perOut: perOut}
}

// create makes an anonymous spool file: it has no name once create returns.
func (s *spool) create() (*os.File, error) {
	f, err := os.CreateTemp(s.dir, "exec-")
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("spool: %w", err)
	}
	return f, nil
}

// reserve takes up to n bytes from the budget and returns how many it got.
func (s *spool) reserve(n int64) int64 {
	for {
		used := s.used.Load()
		got := min(n, s.limit-used)
		if got <= 0 {
			return 0
		}
		if s.used.CompareAndSwap(used, used+got) {
			return got
		}
	}
}

// release returns n reserved bytes to the budget.
func (s *spool) release(n int64) { s.used.Add(-n) }
