package cas

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e37))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func hashes(cs []Chunk) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Hash)
	}
	return out
}

func put(t *testing.T, s *Store, name string, data []byte) ([]Chunk, int64) {
	t.Helper()
	tx := s.Begin()
	cs, err := tx.PutBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	n, err := tx.Commit(name, json.RawMessage(`{"name":"`+name+`"}`), hashes(cs))
	if err != nil {
		t.Fatal(err)
	}
	return cs, tx.Stored() + n
}

func read(t *testing.T, s *Store, cs []Chunk) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := s.WriteTo(&buf, cs); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTripAndDedup(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	data := randBytes(1, 32<<20)
	cs, first := put(t, s, "one", data)
	if got := read(t, s, cs); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if first < 32<<20 {
		t.Fatalf("random data stored in %d bytes: compression cannot do that", first)
	}
	for _, c := range cs[:len(cs)-1] {
		if c.Size < minChunk || c.Size > maxChunk {
			t.Fatalf("chunk of %d bytes outside [%d, %d]", c.Size, minChunk, maxChunk)
		}
	}
	// 1 KiB changed in the middle, and 100 bytes inserted near the start.
	changed := bytes.Clone(data)
	copy(changed[16<<20:], randBytes(2, 1024))
	changed = append(changed[:1000:1000], append(randBytes(3, 100), changed[1000:]...)...)
	cs2, second := put(t, s, "two", changed)
	if got := read(t, s, cs2); !bytes.Equal(got, changed) {
		t.Fatal("read back of the changed file differs")
	}
	if second > first/100 {
		t.Fatalf("second version stored %d bytes of %d: want under 1%%", second, first)
	}
	t.Logf("first %d bytes, second %d bytes", first, second)
	// Same content again: only the root (its list of some 1600 chunk hashes).
	_, third := put(t, s, "three", changed)
	if third > first/200 {
		t.Fatalf("identical content stored %d bytes", third)
	}
}

func TestDeleteCollects(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := randBytes(4, 1<<20)
	b := append(bytes.Clone(a), randBytes(5, 1<<20)...)
	csA, _ := put(t, s, "a", a)
	csB, _ := put(t, s, "b", b)
	st, _ := s.Stats()
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if got := read(t, s, csB); !bytes.Equal(got, b) {
		t.Fatal("b damaged by deleting a")
	}
	st2, _ := s.Stats()
	if st2.Chunks >= st.Chunks || st2.Roots != 1 {
		t.Fatalf("after deleting a: %+v (before %+v)", st2, st)
	}
	if _, err := s.Root("a"); err == nil {
		t.Fatal("root a still readable")
	}
	if err := s.Delete("b"); err != nil {
		t.Fatal(err)
	}
	st3, _ := s.Stats()
	if st3.Chunks != 0 || st3.Roots != 0 || st3.StoredBytes != 0 || st3.Packs != 0 {
		t.Fatalf("store not empty after deleting everything: %+v", st3)
	}
	if _, err := s.ReadChunk(csA[0]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("reading a collected chunk: %v", err)
	}
}

func TestAbortAndCrashLeaveNothing(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	keep, _ := put(t, s, "keep", randBytes(6, 256<<10))
	tx := s.Begin()
	if _, err := tx.PutBytes(randBytes(7, 512<<10)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Reuse(keep); err != nil {
		t.Fatal(err)
	}
	tx.Abort()
	st, _ := s.Stats()
	if st.Chunks != len(keep) || st.Packs != 1 {
		t.Fatalf("after abort %+v, want %d chunks in 1 pack", st, len(keep))
	}
	// A crash after writing chunks but before the root: reopening sweeps them.
	tx = s.Begin()
	if _, err := tx.PutBytes(randBytes(8, 512<<10)); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, _ = s2.Stats()
	if st.Chunks != len(keep) || st.Roots != 1 || st.Packs != 1 {
		t.Fatalf("after reopen: %+v, want %d chunks in 1 pack and 1 root", st, len(keep))
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(entries) != 0 {
		t.Fatalf("tmp holds %d files after reopen", len(entries))
	}
	if data, err := s2.Root("keep"); err != nil || string(data) != `{"name":"keep"}` {
		t.Fatalf("root after reopen: %s, %v", data, err)
	}
}

func TestCorruptionDetected(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, _ := put(t, s, "x", randBytes(9, 200<<10))
	// Damage one chunk inside its pack.
	l := s.loc[cs[1].Hash]
	f, err := os.OpenFile(s.packPath(l.pack, ".pack"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0xde, 0xad, 0xbe, 0xef}, l.off+l.clen/2)
	f.Close()
	if _, err := s.WriteTo(&bytes.Buffer{}, cs); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("swapped chunk: %v, want ErrCorrupt", err)
	}
	// Garbage in the root file.
	rp := filepath.Join(dir, "roots", "x")
	b, _ := os.ReadFile(rp)
	b[len(b)-1] ^= 0xff
	os.WriteFile(rp, b, 0o600)
	if _, err := s.Root("x"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged root: %v, want ErrCorrupt", err)
	}
}

func TestCommitChecks(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, "dup", []byte("hello"))
	tx := s.Begin()
	defer tx.Abort()
	if _, err := tx.Commit("dup", nil, nil); err == nil {
		t.Fatal("second root of the same name accepted")
	}
	if _, err := tx.Commit("../x", nil, nil); err == nil {
		t.Fatal("root name with a path accepted")
	}
	if _, err := tx.Commit("y", nil, []string{"00"}); err == nil {
		t.Fatal("root referring to a chunk the transaction did not store accepted")
	}
}

func FuzzChunker(f *testing.F) {
	f.Add([]byte("hello"), uint16(1))
	f.Add(randBytes(11, 80<<10), uint16(700))
	f.Fuzz(func(t *testing.T, data []byte, step uint16) {
		c := newChunker(&slowReader{data: data, step: int(step%4096) + 1}, gearTable())
		var got []byte
		for {
			ch, err := c.next()
			if err != nil {
				break
			}
			if len(ch) == 0 || len(ch) > maxChunk {
				t.Fatalf("chunk of %d bytes", len(ch))
			}
			got = append(got, ch...)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("chunks do not add up to the input")
		}
	})
}

// slowReader returns at most step bytes per Read, to vary how the chunker's buffer fills.
type slowReader struct {
	data []byte
	step int
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.step)], r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestCompaction(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	// a and b in one pack (one transaction, root "a" holding both); root "b" holds only b:
	// deleting "a" leaves the pack mostly dead.
	a, b := randBytes(20, 4<<20), randBytes(21, 1<<20)
	tx := s.Begin()
	ca, _ := tx.PutBytes(a)
	cb, _ := tx.PutBytes(b)
	if _, err := tx.Commit("a", nil, append(hashes(ca), hashes(cb)...)); err != nil {
		t.Fatal(err)
	}
	tx2 := s.Begin()
	if err := tx2.Reuse(cb); err != nil {
		t.Fatal(err)
	}
	if _, err := tx2.Commit("b", nil, hashes(cb)); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Stats()
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	after, _ := s.Stats()
	if after.StoredBytes > before.StoredBytes/2 || after.Packs != 1 {
		t.Fatalf("after deleting most of a pack: %+v (before %+v)", after, before)
	}
	if got := read(t, s, cb); !bytes.Equal(got, b) {
		t.Fatal("b damaged by compaction")
	}
	s2, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, s2, cb); !bytes.Equal(got, b) {
		t.Fatal("b unreadable after reopening a compacted store")
	}
}

func FuzzDecodeIndex(f *testing.F) {
	f.Add(encodeIndex([]indexEntry{{hash: strings.Repeat("ab", 32), off: 1, clen: 2, size: 3}}))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := decodeIndex(b)
		if err != nil {
			return
		}
		if again := encodeIndex(entries); !bytes.Equal(again, b) {
			t.Fatal("an index that decodes does not encode back to itself")
		}
	})
}
