// Package cas is SPACE's content-addressed chunk store: files are cut into content-defined
// chunks, each stored once, zstd-compressed, under the SHA-256 of its content, and checked
// against that hash whenever it is read. Roots name what is kept: a root is a small document
// (a snapshot's manifest) and the list of chunks it needs. A chunk lives while a root refers to
// it (reference counts, rebuilt from the roots when the store opens) or a transaction that is
// writing it has not finished.
//
// Durability: chunks are written to a temporary name and renamed; a root is written only after
// the file system has been synced, then fsynced and renamed into place. A crash therefore leaves
// either a whole root whose chunks are all on disk, or no root (and chunks nobody refers to,
// which Open removes).
package cas

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/errdefs"
)

// Chunk is one piece of a stored file: the hex SHA-256 of its content and its length.
type Chunk struct {
	Hash string `json:"h"`
	Size int64  `json:"n"`
}

// ErrCorrupt is returned when stored data fails its hash check.
var ErrCorrupt = errors.New("stored data is corrupt")

var (
	hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
)

// Store is a chunk store in one directory. It is safe for concurrent use.
type Store struct {
	dir  string
	log  *slog.Logger
	gear *[256]uint64
	enc  *zstd.Encoder
	dec  *zstd.Decoder

	mu   sync.Mutex
	refs map[string]int // chunk → number of roots referring to it
	pins map[string]int // chunk → number of open transactions that wrote or reused it
}

// Stats describe a store's contents.
type Stats struct {
	Roots       int
	Chunks      int
	StoredBytes int64 // compressed bytes of all chunks on disk
}

// Open opens (creating if needed) the store in dir, rebuilds reference counts from its roots
// and removes chunks and temporary files no root refers to.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, sub := range []string{"chunks", "roots", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("cas: %w", err)
		}
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(16<<20))
	if err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	s := &Store{dir: dir, log: log, gear: gearTable(), enc: enc, dec: dec, refs: map[string]int{}, pins: map[string]int{}}
	if err := os.RemoveAll(filepath.Join(dir, "tmp")); err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	names, err := s.Roots()
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		r, err := s.readRoot(name)
		if err != nil {
			// A root that fails its check is lost either way; its chunks go with the sweep.
			s.log.Error("unreadable root in chunk store", "root", name, "err", err)
			continue
		}
		for _, h := range r.Chunks {
			s.refs[h]++
		}
	}
	if err := s.sweep(); err != nil {
		return nil, err
	}
	return s, nil
}

// Close releases the compressor.
func (s *Store) Close() error {
	s.enc.Close()
	s.dec.Close()
	return nil
}

// sweep removes chunk files with no reference (left by a crash before their root was written).
func (s *Store) sweep() error {
	removed := 0
	err := filepath.WalkDir(filepath.Join(s.dir, "chunks"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if s.refs[d.Name()] == 0 {
			if err := os.Remove(p); err != nil {
				return err
			}
			removed++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cas: sweep: %w", err)
	}
	if removed > 0 {
		s.log.Info("removed unreferenced chunks", "count", removed)
	}
	return nil
}

func (s *Store) chunkPath(h string) string { return filepath.Join(s.dir, "chunks", h[:2], h) }
func (s *Store) rootPath(name string) string {
	return filepath.Join(s.dir, "roots", name)
}

// Txn writes chunks for one future root. Chunks it touches are kept until Commit or Abort.
type Txn struct {
	s      *Store
	mu     sync.Mutex
	pinned map[string]bool
	stored int64
	done   bool
}

// Begin starts a transaction.
func (s *Store) Begin() *Txn { return &Txn{s: s, pinned: map[string]bool{}} }

// Stored is the number of compressed bytes this transaction added to the store so far.
func (t *Txn) Stored() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stored
}

// Put cuts r into chunks, stores those the store lacks and returns the list.
func (t *Txn) Put(r io.Reader) ([]Chunk, error) {
	c := newChunker(r, t.s.gear)
	var out []Chunk
	for {
		data, err := c.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		ch, err := t.putChunk(data)
		if err != nil {
			return nil, err
		}
		out = append(out, ch)
	}
}

// PutBytes stores b as one file's content.
func (t *Txn) PutBytes(b []byte) ([]Chunk, error) { return t.Put(bytes.NewReader(b)) }

// Reuse pins chunks an earlier root stored, so that they outlive its deletion until Commit.
func (t *Txn) Reuse(chunks []Chunk) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range chunks {
		if t.pinned[c.Hash] {
			continue
		}
		if t.s.refs[c.Hash] == 0 && t.s.pins[c.Hash] == 0 {
			return fmt.Errorf("cas: chunk %s is no longer stored: %w", c.Hash, errdefs.ErrNotFound)
		}
		t.pinned[c.Hash] = true
		t.s.pins[c.Hash]++
	}
	return nil
}

func (t *Txn) putChunk(data []byte) (Chunk, error) {
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])
	ch := Chunk{Hash: h, Size: int64(len(data))}
	s := t.s
	s.mu.Lock()
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		s.mu.Unlock()
		return Chunk{}, errors.New("cas: transaction is finished")
	}
	have := s.refs[h] > 0
	if !t.pinned[h] {
		t.pinned[h] = true
		s.pins[h]++
	}
	t.mu.Unlock()
	s.mu.Unlock()
	if have {
		return ch, nil
	}
	// Another transaction may be writing the same chunk right now; both write the same bytes
	// under temporary names and rename, so either result is right, and our pin keeps it.
	if _, err := os.Stat(s.chunkPath(h)); err == nil {
		return ch, nil
	}
	comp := s.enc.EncodeAll(data, make([]byte, 0, len(data)/2+64))
	if err := os.MkdirAll(filepath.Dir(s.chunkPath(h)), 0o700); err != nil {
		return Chunk{}, fmt.Errorf("cas: %w", err)
	}
	if err := writeTemp(filepath.Join(s.dir, "tmp"), s.chunkPath(h), comp, false); err != nil {
		return Chunk{}, fmt.Errorf("cas: write chunk: %w", err)
	}
	t.mu.Lock()
	t.stored += int64(len(comp))
	t.mu.Unlock()
	return ch, nil
}

// root is the stored form of a root.
type root struct {
	Chunks []string        `json:"chunks"`
	Data   json.RawMessage `json:"data"`
}

// Commit durably records a root named name holding data and referring to chunks (each of which
// this transaction wrote or reused), then ends the transaction. It returns the bytes the root
// itself takes on disk. A root of the same name must not exist.
func (t *Txn) Commit(name string, data json.RawMessage, chunks []string) (int64, error) {
	if !nameRE.MatchString(name) {
		return 0, errdefs.InvalidArgument(fmt.Sprintf("cas: bad root name %q", name))
	}
	s := t.s
	uniq := map[string]bool{}
	var list []string
	for _, h := range chunks {
		if !uniq[h] {
			uniq[h] = true
			list = append(list, h)
		}
	}
	t.mu.Lock()
	for _, h := range list {
		if !t.pinned[h] {
			t.mu.Unlock()
			return 0, fmt.Errorf("cas: root %s refers to chunk %s this transaction did not store", name, h)
		}
	}
	t.mu.Unlock()
	if _, err := os.Lstat(s.rootPath(name)); err == nil {
		return 0, fmt.Errorf("cas: root %s: %w", name, errdefs.ErrAlreadyExists)
	}
	body, err := json.Marshal(root{Chunks: list, Data: data})
	if err != nil {
		return 0, err
	}
	comp := s.enc.EncodeAll(body, nil)
	sum := sha256.Sum256(comp)
	file := append(sum[:], comp...)
	// Every chunk (written without fsync, for speed) reaches the disk before the root that
	// needs them.
	if err := syncFS(s.dir); err != nil {
		return 0, fmt.Errorf("cas: sync: %w", err)
	}
	if err := writeTemp(filepath.Join(s.dir, "tmp"), s.rootPath(name), file, true); err != nil {
		return 0, fmt.Errorf("cas: write root: %w", err)
	}
	s.mu.Lock()
	for _, h := range list {
		s.refs[h]++
	}
	s.mu.Unlock()
	t.finish()
	return int64(len(file)), nil
}

// Abort ends the transaction; chunks only it needed are removed.
func (t *Txn) Abort() { t.finish() }

func (t *Txn) finish() {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	t.done = true
	for h := range t.pinned {
		s.pins[h]--
		if s.pins[h] == 0 {
			delete(s.pins, h)
			s.dropIfUnused(h)
		}
	}
}

// dropIfUnused removes chunk h if nothing needs it. The caller holds s.mu.
func (s *Store) dropIfUnused(h string) {
	if s.refs[h] > 0 || s.pins[h] > 0 {
		return
	}
	delete(s.refs, h)
	if err := os.Remove(s.chunkPath(h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("remove chunk", "chunk", h, "err", err)
	}
}

// Root returns the data of root name, checked against its hash.
func (s *Store) Root(name string) (json.RawMessage, error) {
	if !nameRE.MatchString(name) {
		return nil, errdefs.NotFound(fmt.Sprintf("root %q not found", name))
	}
	r, err := s.readRoot(name)
	if err != nil {
		return nil, err
	}
	return r.Data, nil
}

func (s *Store) readRoot(name string) (root, error) {
	var r root
	b, err := os.ReadFile(s.rootPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return r, fmt.Errorf("cas: root %s: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("cas: %w", err)
	}
	if len(b) < sha256.Size {
		return r, fmt.Errorf("cas: root %s: %w", name, ErrCorrupt)
	}
	sum := sha256.Sum256(b[sha256.Size:])
	if !bytes.Equal(sum[:], b[:sha256.Size]) {
		return r, fmt.Errorf("cas: root %s: %w", name, ErrCorrupt)
	}
	body, err := s.dec.DecodeAll(b[sha256.Size:], nil)
	if err != nil {
		return r, fmt.Errorf("cas: root %s: %w: %v", name, ErrCorrupt, err)
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return r, fmt.Errorf("cas: root %s: %w: %v", name, ErrCorrupt, err)
	}
	for _, h := range r.Chunks {
		if !hashRE.MatchString(h) {
			return r, fmt.Errorf("cas: root %s: %w: bad chunk name", name, ErrCorrupt)
		}
	}
	return r, nil
}

// Roots lists the names of all roots.
func (s *Store) Roots() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, "roots"))
	if err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	var out []string
	for _, e := range entries {
		if nameRE.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Delete removes root name; chunks no other root or transaction needs are removed with it.
func (s *Store) Delete(name string) error {
	r, err := s.readRoot(name)
	if err != nil && !errors.Is(err, ErrCorrupt) {
		return err
	}
	if err := os.Remove(s.rootPath(name)); err != nil {
		return fmt.Errorf("cas: %w", err)
	}
	if err := syncPath(filepath.Join(s.dir, "roots")); err != nil {
		return fmt.Errorf("cas: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range r.Chunks {
		if s.refs[h] > 0 {
			s.refs[h]--
		}
		s.dropIfUnused(h)
	}
	return nil
}

// ReadChunk returns the content of chunk c, checked against its hash.
func (s *Store) ReadChunk(c Chunk) ([]byte, error) {
	if !hashRE.MatchString(c.Hash) {
		return nil, fmt.Errorf("cas: chunk %q: %w", c.Hash, ErrCorrupt)
	}
	comp, err := os.ReadFile(s.chunkPath(c.Hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("cas: chunk %s is missing: %w", c.Hash, ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	data, err := s.dec.DecodeAll(comp, make([]byte, 0, c.Size))
	if err != nil {
		return nil, fmt.Errorf("cas: chunk %s: %w: %v", c.Hash, ErrCorrupt, err)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != c.Hash || int64(len(data)) != c.Size {
		return nil, fmt.Errorf("cas: chunk %s: %w: content does not match its hash", c.Hash, ErrCorrupt)
	}
	return data, nil
}

// WriteTo writes the file made of chunks to w, checking every chunk.
func (s *Store) WriteTo(w io.Writer, chunks []Chunk) (int64, error) {
	var n int64
	for _, c := range chunks {
		data, err := s.ReadChunk(c)
		if err != nil {
			return n, err
		}
		m, err := w.Write(data)
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Stats counts what the store holds.
func (s *Store) Stats() (Stats, error) {
	var st Stats
	roots, err := s.Roots()
	if err != nil {
		return st, err
	}
	st.Roots = len(roots)
	err = filepath.WalkDir(filepath.Join(s.dir, "chunks"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st.Chunks++
		st.StoredBytes += fi.Size()
		return nil
	})
	return st, err
}

// writeTemp writes data to a temporary file in tmpDir and renames it to dst; with durable, the
// file and dst's directory are fsynced.
func writeTemp(tmpDir, dst string, data []byte, durable bool) error {
	f, err := os.CreateTemp(tmpDir, "w-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if durable {
		return syncPath(filepath.Dir(dst))
	}
	return nil
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// syncFS flushes the whole file system holding dir.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
