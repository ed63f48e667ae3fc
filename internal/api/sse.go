package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// keepaliveInterval is how often an idle SSE stream gets a comment line.
const keepaliveInterval = 15 * time.Second

// sseStream writes server-sent events, flushing each, with a keepalive comment while idle.
type sseStream struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	err  error
	stop chan struct{}
	once sync.Once
}

func wantsSSE(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// startSSE writes the SSE headers and starts the keepalive. Call close when done.
func startSSE(w http.ResponseWriter, status int) *sseStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(status)
	s := &sseStream{w: w, rc: http.NewResponseController(w), stop: make(chan struct{})}
	_ = s.rc.Flush()
	go s.keepalive()
	return s
}

func (s *sseStream) keepalive() {
	t := time.NewTicker(keepaliveInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.mu.Lock()
			if s.err == nil {
				if _, err := fmt.Fprint(s.w, ": keepalive\n\n"); err != nil {
					s.err = err
				} else {
					s.err = s.rc.Flush()
				}
			}
			s.mu.Unlock()
		}
	}
}

// send writes one event whose data is v as one JSON line.
func (s *sseStream) send(event string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", event, data); err != nil {
		s.err = err
		return err
	}
	s.err = s.rc.Flush()
	return s.err
}

// close stops the keepalive; nothing is written after it returns (the handler may return).
func (s *sseStream) close() {
	s.once.Do(func() { close(s.stop) })
	s.mu.Lock()
	if s.err == nil {
		s.err = errStreamClosed
	}
	s.mu.Unlock()
}

var errStreamClosed = errors.New("stream closed")
