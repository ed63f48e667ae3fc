package client

import (
	"errors"
	"io"
	"iter"
	"sync"
)

// Stream is an open server-sent events response, decoded into values of type T. Read it with
// Next or All; Close it when done (closing early is fine and releases the connection). Next and
// All must not be called concurrently; Close may be called from any goroutine to stop a reader
// blocked in Next.
type Stream[T any] struct {
	body      io.ReadCloser
	sse       *sseReader
	decode    func(sseEvent) (T, bool, error) // false: skip the event
	closeOnce sync.Once
	closeErr  error
}

func newStream[T any](body io.ReadCloser, decode func(sseEvent) (T, bool, error)) *Stream[T] {
	return &Stream[T]{body: body, sse: newSSEReader(body), decode: decode}
}

// Next returns the next value. It returns io.EOF when the server ended the stream, and another
// error if the connection failed, the context was cancelled or an event could not be decoded.
func (s *Stream[T]) Next() (T, error) {
	for {
		ev, err := s.sse.Next()
		if err != nil {
			var zero T
			return zero, err
		}
		v, ok, err := s.decode(ev)
		if err != nil {
			var zero T
			return zero, err
		}
		if ok {
			return v, nil
		}
	}
}

// All iterates over the stream's values until it ends, then closes it. A failure ends the
// iteration with one (zero value, error) pair; the clean end of the stream is not reported.
// Breaking out of the loop closes the stream too.
func (s *Stream[T]) All() iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		defer s.Close()
		for {
			v, err := s.Next()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				yield(v, err)
				return
			}
			if !yield(v, nil) {
				return
			}
		}
	}
}

// Close ends the stream and releases its connection.
func (s *Stream[T]) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.body.Close() })
	return s.closeErr
}
