package cas

import (
	"errors"
	"io"
)

// Content-defined chunking: a cut falls where a rolling hash of the last bytes has its top
// bits zero, so an insertion or deletion moves only the cuts next to it and the chunks after
// it are the same as before. Sizes are bounded to [minChunk, maxChunk] and average about
// minChunk + 2^avgBits.
const (
	minChunk = 4 << 10
	maxChunk = 64 << 10
	avgBits  = 14
	cutMask  = uint64(1<<avgBits-1) << (64 - avgBits)
)

// gearTable returns 256 pseudo-random 64-bit values, fixed for all time (changing them changes
// every cut and so defeats deduplication against existing chunks).
func gearTable() *[256]uint64 {
	var t [256]uint64
	x := uint64(0x5350414345434443) // "SPACECDC"
	for i := range t {
		// splitmix64
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		t[i] = z ^ (z >> 31)
	}
	return &t
}

// chunker splits a stream into content-defined chunks.
type chunker struct {
	r    io.Reader
	gear *[256]uint64
	buf  []byte // holds up to 2*maxChunk bytes
	lo   int    // start of unconsumed data in buf
	hi   int    // end of data in buf
	eof  bool
}

func newChunker(r io.Reader, gear *[256]uint64) *chunker {
	return &chunker{r: r, gear: gear, buf: make([]byte, 2*maxChunk)}
}

// next returns the next chunk (valid until the following call) or io.EOF.
func (c *chunker) next() ([]byte, error) {
	if err := c.fill(); err != nil {
		return nil, err
	}
	data := c.buf[c.lo:c.hi]
	if len(data) == 0 {
		return nil, io.EOF
	}
	n := cut(data, c.gear)
	c.lo += n
	return data[:n], nil
}

// fill makes sure at least maxChunk bytes are buffered unless the stream ended.
func (c *chunker) fill() error {
	if c.hi-c.lo >= maxChunk || c.eof {
		return nil
	}
	copy(c.buf, c.buf[c.lo:c.hi])
	c.hi -= c.lo
	c.lo = 0
	for c.hi < len(c.buf) && !c.eof {
		n, err := c.r.Read(c.buf[c.hi:])
		c.hi += n
		if errors.Is(err, io.EOF) {
			c.eof = true
		} else if err != nil {
			return err
		}
	}
	return nil
}

// cut returns the length of the first chunk of data.
func cut(data []byte, gear *[256]uint64) int {
	if len(data) <= minChunk {
		return len(data)
	}
	end := min(len(data), maxChunk)
	var h uint64
	// The hash window is the last 64 bytes (older bytes have shifted out), so starting a little
	// before minChunk gives the same cuts as hashing from the chunk's start.
	for i := minChunk - 64; i < end; i++ {
		h = h<<1 + gear[data[i]]
		if i >= minChunk && h&cutMask == 0 {
			return i + 1
		}
	}
	return end
}
