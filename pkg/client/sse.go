package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// sseEvent is one event of a text/event-stream.
type sseEvent struct {
	Type string // the event: field, "message" when the event had none
	Data string // the data: lines joined with "\n"
	ID   string // the last id: field seen, carried over between events as the spec says
}

// maxSSELine bounds one line (and one event's data) so that a broken server cannot make the
// client buffer without limit.
const maxSSELine = 64 << 20

var errSSETooLong = errors.New("sse: event larger than 64 MiB")

// sseReader parses a text/event-stream as the HTML standard describes it: lines end with CRLF,
// LF or a lone CR; a blank line dispatches the event; lines starting with ':' are comments;
// "field: value" loses one space after the colon; data lines accumulate; unknown fields are
// ignored; an event with no data is not dispatched; an unfinished event at EOF is dropped.
type sseReader struct {
	br      *bufio.Reader
	line    []byte
	skipLF  bool // the last line ended with CR: a LF right after it belongs to it
	started bool // past the optional byte order mark
	lastID  string
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{br: bufio.NewReaderSize(r, 32<<10)}
}

// Next returns the next event, or io.EOF when the stream ends cleanly.
func (r *sseReader) Next() (sseEvent, error) {
	var (
		typ     string
		data    strings.Builder
		hasData bool
	)
	for {
		line, err := r.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return sseEvent{}, io.EOF
			}
			return sseEvent{}, err
		}
		if len(line) == 0 {
			if !hasData {
				typ = ""
				continue
			}
			if typ == "" {
				typ = "message"
			}
			return sseEvent{Type: typ, Data: data.String(), ID: r.lastID}, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "event":
			typ = string(value)
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			if data.Len()+len(value) > maxSSELine {
				return sseEvent{}, errSSETooLong
			}
			data.Write(value)
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				r.lastID = string(value)
			}
		}
	}
}

// readLine returns the next line without its terminator. The returned slice is valid until the
// next call. A line cut off by the end of the stream is reported as io.EOF, since the event it
// belongs to is incomplete.
func (r *sseReader) readLine() ([]byte, error) {
	r.line = r.line[:0]
	for {
		if r.br.Buffered() == 0 {
			if _, err := r.br.Peek(1); err != nil {
				if errors.Is(err, io.EOF) {
					return nil, io.EOF
				}
				return nil, fmt.Errorf("sse: read: %w", err)
			}
		}
		buf, _ := r.br.Peek(r.br.Buffered())
		if r.skipLF {
			r.skipLF = false
			if buf[0] == '\n' {
				r.br.Discard(1) //nolint:errcheck // the byte is buffered
				continue
			}
		}
		if !r.started {
			// A UTF-8 byte order mark may open the stream; wait for enough bytes to tell.
			if len(buf) < 3 && bytes.HasPrefix([]byte("\xEF\xBB\xBF"), buf) {
				if _, err := r.br.Peek(3); err == nil {
					continue
				}
			}
			r.started = true
			if bytes.HasPrefix(buf, []byte("\xEF\xBB\xBF")) {
				r.br.Discard(3) //nolint:errcheck // the bytes are buffered
				continue
			}
		}
		if i := bytes.IndexAny(buf, "\r\n"); i >= 0 {
			r.line = append(r.line, buf[:i]...)
			r.skipLF = buf[i] == '\r'
			r.br.Discard(i + 1) //nolint:errcheck // the bytes are buffered
			return r.line, nil
		}
		if len(r.line)+len(buf) > maxSSELine {
			return nil, errSSETooLong
		}
		r.line = append(r.line, buf...)
		r.br.Discard(len(buf)) //nolint:errcheck // the bytes are buffered
	}
}
