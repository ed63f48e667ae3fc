// Package cas is SPACE's content-addressed chunk store: files are cut into content-defined
// chunks, each stored once, zstd-compressed, under the SHA-256 of its content, and checked
// against that hash whenever it is read. Roots name what is kept: a root is a small document
// (a snapshot's manifest) and the list of chunks it needs. A chunk lives while a root refers to
// it (reference counts, rebuilt from the roots when the store opens) or a transaction that
// reuses it has not finished.
//
// Layout: the new chunks of one transaction go into one pack file (packs/<id>.pack) with an
// index beside it (packs/<id>.idx: hash, offset, lengths, and a checksum of the index), so that
// a snapshot of thousands of chunks costs a few files and one fsync, not thousands. A pack goes
// when none of its chunks is live; one that is mostly dead is rewritten with only its live chunks.
//
// Durability: a pack and its index are fsynced and renamed into place before the root that
// needs them is written, fsynced and renamed. A crash therefore leaves either a whole root whose
// chunks are all on disk, or no root (and packs nobody refers to, which Open removes).
package cas

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
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
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/space-sandbox/space/internal/durable"
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

// loc is where a chunk is stored.
type loc struct {
	pack string
	off  int64
	clen int64 // compressed length in the pack
	size int64 // uncompressed length
}

// pack is one pack file as the store tracks it.
type pack struct {
	bytes     int64 // file size
	live      int   // chunks of it that are live
	liveBytes int64
	f         *os.File // opened on first read
}

// Store is a chunk store in one directory. It is safe for concurrent use.
type Store struct {
	dir  string
	log  *slog.Logger
	gear *[256]uint64
	enc  *zstd.Encoder
	dec  *zstd.Decoder

	mu    sync.Mutex
	loc   map[string]loc   // live chunks
	packs map[string]*pack // by pack ID
	refs  map[string]int   // chunk → number of roots referring to it
	pins  map[string]int   // chunk → number of open transactions reusing it
}

// Stats describe a store's contents.
type Stats struct {
	Roots       int
	Chunks      int
	Packs       int
	StoredBytes int64 // bytes of all pack files
}

// Open opens (creating if needed) the store in dir, rebuilds its index and reference counts
// and removes packs and temporary files no root needs.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(16<<20))
	if err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	s := &Store{dir: dir, log: log, gear: gearTable(), enc: enc, dec: dec,
		loc: map[string]loc{}, packs: map[string]*pack{}, refs: map[string]int{}, pins: map[string]int{}}
	if err := os.RemoveAll(filepath.Join(dir, "tmp")); err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	for _, sub := range []string{"packs", "roots", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("cas: %w", err)
		}
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
	if err := s.loadPacks(); err != nil {
		return nil, err
	}
	for h := range s.refs {
		if _, ok := s.loc[h]; !ok {
			s.log.Error("a root refers to a chunk the store lacks", "chunk", h)
		}
	}
	return s, nil
}

// loadPacks reads every pack index, keeps the chunks some root refers to and removes packs
// with none (or with no index: a pack whose transaction never committed).
func (s *Store) loadPacks() error {
	dir := filepath.Join(s.dir, "packs")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("cas: %w", err)
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
	}
	for _, e := range entries {
		name := e.Name()
		id, ok := strings.CutSuffix(name, ".pack")
		if !ok {
			if id, ok := strings.CutSuffix(name, ".idx"); !ok || !have[id+".pack"] {
				s.log.Warn("removing stray file in the chunk store", "file", name)
				os.Remove(filepath.Join(dir, name))
			}
			continue
		}
		if !have[id+".idx"] {
			s.log.Warn("removing a pack without index (an unfinished write)", "pack", id)
			os.Remove(filepath.Join(dir, name))
			continue
		}
		idx, err := readIndex(filepath.Join(dir, id+".idx"))
		if err != nil {
			s.log.Error("unreadable pack index; its chunks are lost", "pack", id, "err", err)
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return fmt.Errorf("cas: %w", err)
		}
		p := &pack{bytes: fi.Size()}
		s.packs[id] = p
		for _, x := range idx {
			if _, dup := s.loc[x.hash]; dup || s.refs[x.hash] == 0 || x.off+x.clen > p.bytes {
				continue
			}
			s.loc[x.hash] = loc{pack: id, off: x.off, clen: x.clen, size: x.size}
			p.live++
			p.liveBytes += x.clen
		}
	}
	for id, p := range s.packs {
		if p.live == 0 {
			s.removePack(id)
		}
	}
	return nil
}

// Close releases the compressor and open pack files.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.packs {
		if p.f != nil {
			p.f.Close()
			p.f = nil
		}
	}
	s.enc.Close()
	s.dec.Close()
	return nil
}

func (s *Store) rootPath(name string) string { return filepath.Join(s.dir, "roots", name) }
func (s *Store) packPath(id, ext string) string {
	return filepath.Join(s.dir, "packs", id+ext)
}

// removePack deletes pack id's files. The caller holds s.mu (or owns s exclusively).
func (s *Store) removePack(id string) {
	if p := s.packs[id]; p != nil && p.f != nil {
		p.f.Close()
	}
	delete(s.packs, id)
	for _, ext := range []string{".idx", ".pack"} { // the index first: a pack without one is ignored
		if err := os.Remove(s.packPath(id, ext)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("remove pack", "pack", id, "err", err)
		}
	}
}

// indexEntry is one chunk in a pack index.
type indexEntry struct {
	hash      string
	off, clen int64
	size      int64
}

const indexEntrySize = 32 + 8 + 8 + 8

// encodeIndex lays out entries followed by the SHA-256 of all of them.
func encodeIndex(entries []indexEntry) []byte {
	b := make([]byte, 0, len(entries)*indexEntrySize+32)
	for _, e := range entries {
		raw, _ := hex.DecodeString(e.hash)
		b = append(b, raw...)
		b = binary.LittleEndian.AppendUint64(b, uint64(e.off))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.clen))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.size))
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func readIndex(path string) ([]indexEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return decodeIndex(b)
}

// decodeIndex reverses encodeIndex, refusing anything whose checksum does not match.
func decodeIndex(b []byte) ([]indexEntry, error) {
	if len(b) < 32 || (len(b)-32)%indexEntrySize != 0 {
		return nil, ErrCorrupt
	}
	body, sum := b[:len(b)-32], b[len(b)-32:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, ErrCorrupt
	}
	out := make([]indexEntry, 0, len(body)/indexEntrySize)
	for i := 0; i < len(body); i += indexEntrySize {
		e := body[i : i+indexEntrySize]
		out = append(out, indexEntry{
			hash: hex.EncodeToString(e[:32]),
			off:  int64(binary.LittleEndian.Uint64(e[32:])),
			clen: int64(binary.LittleEndian.Uint64(e[40:])),
			size: int64(binary.LittleEndian.Uint64(e[48:])),
		})
	}
	return out, nil
}

// Txn writes chunks for one future root. Chunks it reuses are kept until Commit or Abort; the
// ones it writes go into its own pack, which becomes part of the store at Commit.
type Txn struct {
	s      *Store
	mu     sync.Mutex
	pinned map[string]bool       // committed chunks this transaction reuses
	local  map[string]indexEntry // chunks written into this transaction's pack
	order  []string
	id     string
	pf     *os.File
	off    int64
	stored int64
	done   bool
}

// Begin starts a transaction.
func (s *Store) Begin() *Txn {
	return &Txn{s: s, pinned: map[string]bool{}, local: map[string]indexEntry{}, id: randomID()}
}

func randomID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

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
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return errors.New("cas: transaction is finished")
	}
	for _, c := range chunks {
		if t.pinned[c.Hash] {
			continue
		}
		if _, ok := t.local[c.Hash]; ok {
			continue
		}
		if _, ok := s.loc[c.Hash]; !ok {
			return fmt.Errorf("cas: chunk %s is no longer stored: %w", c.Hash, errdefs.ErrNotFound)
		}
		t.pinned[c.Hash] = true
		s.pins[c.Hash]++
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
	if _, ok := t.local[h]; ok || t.pinned[h] {
		t.mu.Unlock()
		s.mu.Unlock()
		return ch, nil
	}
	if _, ok := s.loc[h]; ok { // committed and live: keep it so until we commit
		t.pinned[h] = true
		s.pins[h]++
		t.mu.Unlock()
		s.mu.Unlock()
		return ch, nil
	}
	s.mu.Unlock()
	defer t.mu.Unlock()
	if t.pf == nil {
		f, err := os.OpenFile(filepath.Join(s.dir, "tmp", t.id+".pack"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return Chunk{}, fmt.Errorf("cas: %w", err)
		}
		t.pf = f
	}
	comp := s.enc.EncodeAll(data, make([]byte, 0, len(data)/2+64))
	if _, err := t.pf.Write(comp); err != nil {
		return Chunk{}, fmt.Errorf("cas: write pack: %w", err)
	}
	t.local[h] = indexEntry{hash: h, off: t.off, clen: int64(len(comp)), size: int64(len(data))}
	t.order = append(t.order, h)
	t.off += int64(len(comp))
	t.stored += int64(len(comp))
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
	defer t.mu.Unlock()
	if t.done {
		return 0, errors.New("cas: transaction is finished")
	}
	for _, h := range list {
		if _, ok := t.local[h]; !ok && !t.pinned[h] {
			return 0, fmt.Errorf("cas: root %s refers to chunk %s this transaction did not store", name, h)
		}
	}
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
	// The pack and its index reach the disk before the root that needs them.
	if t.pf != nil {
		if err := t.publishPack(); err != nil {
			return 0, fmt.Errorf("cas: write pack: %w", err)
		}
	}
	if err := writeTemp(filepath.Join(s.dir, "tmp"), s.rootPath(name), file); err != nil {
		return 0, fmt.Errorf("cas: write root: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.pf != nil {
		p := &pack{bytes: t.off}
		s.packs[t.id] = p
		for _, h := range t.order {
			e := t.local[h]
			if _, dup := s.loc[h]; dup || !uniq[h] {
				continue // stored meanwhile by another transaction, or not needed: dead space
			}
			s.loc[h] = loc{pack: t.id, off: e.off, clen: e.clen, size: e.size}
			p.live++
			p.liveBytes += e.clen
		}
		t.pf = nil
		if p.live == 0 {
			s.removePack(t.id)
		}
	}
	for _, h := range list {
		s.refs[h]++
	}
	t.unpinLocked()
	return int64(len(file)), nil
}

// publishPack makes the transaction's pack durable and moves it with its index into packs/.
func (t *Txn) publishPack() error {
	s := t.s
	if err := t.pf.Sync(); err != nil {
		return err
	}
	if err := t.pf.Close(); err != nil {
		return err
	}
	entries := make([]indexEntry, 0, len(t.order))
	for _, h := range t.order {
		entries = append(entries, t.local[h])
	}
	tmpIdx := filepath.Join(s.dir, "tmp", t.id+".idx")
	if err := os.WriteFile(tmpIdx, encodeIndex(entries), 0o600); err != nil {
		return err
	}
	if err := durable.Sync(tmpIdx); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(s.dir, "tmp", t.id+".pack"), s.packPath(t.id, ".pack")); err != nil {
		return err
	}
	if err := os.Rename(tmpIdx, s.packPath(t.id, ".idx")); err != nil {
		return err
	}
	return durable.Sync(filepath.Join(s.dir, "packs"))
}

// Abort ends the transaction; its pack is removed and reused chunks are let go.
func (t *Txn) Abort() {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	if t.pf != nil {
		t.pf.Close()
		os.Remove(filepath.Join(s.dir, "tmp", t.id+".pack"))
		t.pf = nil
	}
	t.unpinLocked()
}

// unpinLocked ends the transaction's pins. The caller holds s.mu and t.mu.
func (t *Txn) unpinLocked() {
	t.done = true
	for h := range t.pinned {
		t.s.pins[h]--
		if t.s.pins[h] <= 0 {
			delete(t.s.pins, h)
			t.s.dropIfUnused(h)
		}
	}
}

// dropIfUnused forgets chunk h if nothing needs it, and removes its pack once nothing in it is
// live. The caller holds s.mu.
func (s *Store) dropIfUnused(h string) {
	if s.refs[h] > 0 || s.pins[h] > 0 {
		return
	}
	delete(s.refs, h)
	l, ok := s.loc[h]
	if !ok {
		return
	}
	delete(s.loc, h)
	p := s.packs[l.pack]
	if p == nil {
		return
	}
	p.live--
	p.liveBytes -= l.clen
	if p.live <= 0 {
		s.removePack(l.pack)
	}
}

// compact rewrites packs that are mostly dead space with only their live chunks. The caller
// holds s.mu.
func (s *Store) compact() {
	for id, p := range s.packs {
		if p.bytes < 1<<20 || p.liveBytes*2 >= p.bytes {
			continue
		}
		if err := s.rewritePack(id); err != nil {
			s.log.Warn("compact pack", "pack", id, "err", err)
		}
	}
}

// rewritePack copies pack id's live chunks into a new pack and removes the old one. A crash in
// between leaves both, with the same chunks; Open keeps one copy of each.
func (s *Store) rewritePack(id string) error {
	old := s.packs[id]
	f, err := s.packFile(id, old)
	if err != nil {
		return err
	}
	nid := randomID()
	tmp := filepath.Join(s.dir, "tmp", nid+".pack")
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	var entries []indexEntry
	var off int64
	for h, l := range s.loc {
		if l.pack != id {
			continue
		}
		buf := make([]byte, l.clen)
		if _, err := f.ReadAt(buf, l.off); err != nil {
			out.Close()
			os.Remove(tmp)
			return err
		}
		if _, err := out.Write(buf); err != nil {
			out.Close()
			os.Remove(tmp)
			return err
		}
		entries = append(entries, indexEntry{hash: h, off: off, clen: l.clen, size: l.size})
		off += l.clen
	}
	if err := out.Sync(); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	out.Close()
	if err := writeTemp(filepath.Join(s.dir, "tmp"), s.packPath(nid, ".idx"), encodeIndex(entries)); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, s.packPath(nid, ".pack")); err != nil {
		os.Remove(s.packPath(nid, ".idx"))
		return err
	}
	if err := durable.Sync(filepath.Join(s.dir, "packs")); err != nil {
		return err
	}
	np := &pack{bytes: off}
	s.packs[nid] = np
	for _, e := range entries {
		s.loc[e.hash] = loc{pack: nid, off: e.off, clen: e.clen, size: e.size}
		np.live++
		np.liveBytes += e.clen
	}
	s.removePack(id)
	s.log.Info("compacted pack", "from", id, "to", nid, "bytes_before", old.bytes, "bytes_after", off)
	return nil
}

// packFile returns the open pack file of id. The caller holds s.mu.
func (s *Store) packFile(id string, p *pack) (*os.File, error) {
	if p.f == nil {
		f, err := os.Open(s.packPath(id, ".pack"))
		if err != nil {
			return nil, err
		}
		p.f = f
	}
	return p.f, nil
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
	if err := durable.Sync(filepath.Join(s.dir, "roots")); err != nil {
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
	s.compact()
	return nil
}

// ReadChunk returns the content of chunk c, checked against its hash.
func (s *Store) ReadChunk(c Chunk) ([]byte, error) {
	if !hashRE.MatchString(c.Hash) {
		return nil, fmt.Errorf("cas: chunk %q: %w", c.Hash, ErrCorrupt)
	}
	s.mu.Lock()
	l, ok := s.loc[c.Hash]
	var f *os.File
	var err error
	if ok {
		f, err = s.packFile(l.pack, s.packs[l.pack])
	}
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("cas: chunk %s is missing: %w", c.Hash, ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("cas: %w", err)
	}
	comp := make([]byte, l.clen)
	if _, err := f.ReadAt(comp, l.off); err != nil {
		return nil, fmt.Errorf("cas: chunk %s: %w: %v", c.Hash, ErrCorrupt, err)
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

// RootChunks returns the chunk hashes root name refers to.
func (s *Store) RootChunks(name string) ([]string, error) {
	if !nameRE.MatchString(name) {
		return nil, errdefs.NotFound(fmt.Sprintf("root %q not found", name))
	}
	r, err := s.readRoot(name)
	if err != nil {
		return nil, err
	}
	return r.Chunks, nil
}

// StoredSize returns the bytes chunk h takes in the store (compressed), if it is stored.
func (s *Store) StoredSize(h string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.loc[h]
	return l.clen, ok
}

// Stats counts what the store holds.
func (s *Store) Stats() (Stats, error) {
	roots, err := s.Roots()
	if err != nil {
		return Stats{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Roots: len(roots), Chunks: len(s.loc), Packs: len(s.packs)}
	for _, p := range s.packs {
		st.StoredBytes += p.bytes
	}
	return st, nil
}

// writeTemp writes data to a temporary file in tmpDir, fsyncs it, renames it to dst and fsyncs
// dst's directory.
func writeTemp(tmpDir, dst string, data []byte) error {
	f, err := os.CreateTemp(tmpDir, "w-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
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
	return durable.Sync(filepath.Dir(dst))
}
