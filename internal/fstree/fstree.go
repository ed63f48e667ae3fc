// Package fstree records directory trees (a sandbox's writable layer, a checkpoint image) into
// the chunk store as manifests, writes them back out, compares them, and answers what a path
// looks like through a stack of overlay layers. Entries keep what overlayfs and the runtimes
// care about: type (whiteouts are 0:0 character devices), mode with setuid and sticky bits,
// ownership, times, extended attributes (trusted.overlay.opaque) and symlink targets.
package fstree

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/confine"
)

// Entry is one file, directory, link or device of a tree.
type Entry struct {
	Path   string            `json:"p"` // slash-separated, relative to the tree's root, never "" or "."
	Type   string            `json:"t"` // f d l c b p
	Mode   uint32            `json:"m"` // permission bits with setuid, setgid and sticky
	UID    int               `json:"u,omitempty"`
	GID    int               `json:"g,omitempty"`
	MTime  int64             `json:"mt,omitempty"` // nanoseconds since the epoch
	Size   int64             `json:"s,omitempty"`
	Target string            `json:"l,omitempty"`
	Rdev   uint64            `json:"r,omitempty"`
	Xattrs map[string][]byte `json:"x,omitempty"`
	Chunks []cas.Chunk       `json:"c,omitempty"`
	// Identity of the file on the host it was captured from, to tell unchanged files next time.
	Ino   uint64 `json:"i,omitempty"`
	CTime int64  `json:"ct,omitempty"`

	layer string // host directory the content can be read from, for entries of a directory layer
}

// Whiteout reports whether e marks a deletion (overlayfs: a 0:0 character device).
func (e Entry) Whiteout() bool { return e.Type == "c" && e.Rdev == 0 }

// Opaque reports whether e is a directory that hides the layers below it.
func (e Entry) Opaque() bool {
	return e.Type == "d" && string(e.Xattrs["trusted.overlay.opaque"]) == "y"
}

// Tree is a captured directory, parents before children.
type Tree struct {
	Entries    []Entry   `json:"entries"`
	CapturedAt time.Time `json:"captured_at"`
}

// Size is the total length of the tree's regular files.
func (t Tree) Size() int64 {
	var n int64
	for _, e := range t.Entries {
		n += e.Size
	}
	return n
}

// Chunks lists every chunk hash the tree refers to.
func (t Tree) Chunks() []string {
	var out []string
	for _, e := range t.Entries {
		for _, c := range e.Chunks {
			out = append(out, c.Hash)
		}
	}
	return out
}

// Index maps paths to entries.
func (t Tree) Index() map[string]Entry {
	m := make(map[string]Entry, len(t.Entries))
	for _, e := range t.Entries {
		m[e.Path] = e
	}
	return m
}

// RacyWindow is how close to a capture a change can be and still carry the same ctime as the
// capture saw (file system timestamps come from a coarse clock, a jiffy of up to 10 ms).
const RacyWindow = 20 * time.Millisecond

// Racy reports whether some regular file of t changed so close to the start of its capture
// that a later capture cannot trust its times (see Capture).
func (t Tree) Racy() bool {
	limit := t.CapturedAt.Add(-RacyWindow).UnixNano()
	for _, e := range t.Entries {
		if e.Type == "f" && e.CTime >= limit {
			return true
		}
	}
	return false
}

// Capture records dir into tx. A regular file whose host identity, size and times equal its
// entry in prev (a capture of the same directory at prevAt) keeps that entry's chunks unread.
// dir is a tree the sandbox wrote: it is read through confine, so no link in it is followed
// and content comes only from the regular file that was described.
func Capture(tx *cas.Txn, dir string, prev map[string]Entry, prevAt time.Time) (Tree, error) {
	root, err := confine.Open(dir)
	if err != nil {
		return Tree{}, err
	}
	defer root.Close()
	t := Tree{CapturedAt: time.Now()}
	trustBefore := prevAt.Add(-RacyWindow).UnixNano()
	err = root.Walk("", func(ce confine.Entry) error {
		if ce.Path == "" {
			return nil
		}
		e, err := entryOf(ce)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walked; a frozen pass settles it
			}
			return err
		}
		if e.Type == "" {
			return nil // sockets
		}
		if e.Type == "f" {
			if old, ok := prev[e.Path]; ok && old.Type == "f" && old.Ino == e.Ino && old.Size == e.Size &&
				old.MTime == e.MTime && old.CTime == e.CTime && e.CTime < trustBefore {
				if err := tx.Reuse(old.Chunks); err == nil {
					e.Chunks = old.Chunks
					t.Entries = append(t.Entries, e)
					return nil
				}
			}
			f, info, err := ce.Open()
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, confine.ErrNotRegular) || errors.Is(err, confine.ErrSymlink) {
				return nil // replaced while we walked; a frozen pass settles it
			}
			if err != nil {
				return err
			}
			cs, err := tx.Put(f)
			f.Close()
			if err != nil {
				return fmt.Errorf("store %s: %w", e.Path, err)
			}
			// The identity of the file that was read, not of the name that was listed.
			e.Ino, e.MTime, e.CTime, e.Mode, e.UID, e.GID = info.Ino, info.MTime, info.CTime, info.Perm(), info.UID, info.GID
			e.Chunks = cs
			var n int64
			for _, c := range cs {
				n += c.Size
			}
			e.Size = n // what was read, even if the file changed since the stat
		}
		t.Entries = append(t.Entries, e)
		return nil
	})
	if err != nil {
		return Tree{}, err
	}
	return t, nil
}

// entryOf describes a walked entry (without content).
func entryOf(ce confine.Entry) (Entry, error) {
	st := ce.Info
	e := Entry{
		Path: ce.Path, Mode: st.Perm(), UID: st.UID, GID: st.GID,
		MTime: st.MTime, CTime: st.CTime, Ino: st.Ino,
	}
	switch st.Type() {
	case unix.S_IFREG:
		e.Type, e.Size = "f", st.Size
	case unix.S_IFDIR:
		e.Type = "d"
	case unix.S_IFLNK:
		e.Type = "l"
		target, err := ce.Readlink()
		if err != nil {
			return Entry{}, err
		}
		e.Target = target
	case unix.S_IFCHR:
		e.Type, e.Rdev = "c", st.Rdev
	case unix.S_IFBLK:
		e.Type, e.Rdev = "b", st.Rdev
	case unix.S_IFIFO:
		e.Type = "p"
	default:
		return Entry{}, nil
	}
	x, err := ce.Xattrs()
	if err != nil {
		return Entry{}, err
	}
	e.Xattrs = x
	return e, nil
}

// ChunkSource gives file contents back by their chunks (a *cas.Store).
type ChunkSource interface {
	WriteTo(w io.Writer, chunks []cas.Chunk) (int64, error)
}

// Materialize writes t into the existing empty directory dir, reading file contents from s.
// Every chunk is hash-checked; a damaged tree fails instead of producing wrong files. A tree is
// what a sandbox wrote, so it goes to the host through confine: nothing is written through a
// link, set-id bits, devices and fifos are dropped (whiteouts are kept: overlayfs needs them).
func Materialize(s ChunkSource, t Tree, dir string) error {
	root, err := confine.Open(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, e := range t.Entries {
		if err := checkPath(e.Path); err != nil {
			return err
		}
		if err := create(root, s, e); err != nil {
			return err
		}
	}
	// Directories last and deepest first: creating their children changed their times.
	for i := len(t.Entries) - 1; i >= 0; i-- {
		e := t.Entries[i]
		if e.Type == "d" {
			if err := root.SetMeta(e.Path, meta(e)); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkPath refuses paths that would leave the tree.
func checkPath(p string) error {
	if c, err := confine.Clean(p); err != nil || c == "" {
		return fmt.Errorf("fstree: bad path %q in tree", p)
	}
	return nil
}

func meta(e Entry) confine.Meta {
	return confine.Meta{UID: e.UID, GID: e.GID, Mode: e.Mode, MTime: e.MTime, Xattrs: e.Xattrs}
}

func create(root *confine.Root, s ChunkSource, e Entry) error {
	switch e.Type {
	case "d":
		return root.Mkdir(e.Path, 0o700) // meta later
	case "f":
		f, err := root.Create(e.Path, 0o600)
		if err != nil {
			return err
		}
		_, err = s.WriteTo(f, e.Chunks)
		if err == nil {
			err = confine.SetFileMeta(f, meta(e))
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", e.Path, err)
		}
		return nil
	case "l":
		if err := root.Symlink(e.Target, e.Path); err != nil {
			return err
		}
	case "c":
		if !e.Whiteout() {
			return nil // devices never reach the host
		}
		if err := root.Whiteout(e.Path); err != nil {
			return err
		}
	case "b", "p":
		return nil // devices and fifos never reach the host
	default:
		return fmt.Errorf("fstree: unknown entry type %q at %s", e.Type, e.Path)
	}
	return root.SetMeta(e.Path, meta(e))
}

// Open returns e's content: from the chunk store for captured entries, from the host for
// entries of a directory layer.
func Open(s ChunkSource, e Entry) (io.ReadCloser, error) {
	if e.layer != "" {
		root, err := confine.Open(e.layer)
		if err != nil {
			return nil, err
		}
		defer root.Close()
		f, _, err := root.Open(e.Path)
		return f, err
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := s.WriteTo(pw, e.Chunks)
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// Change is one difference between two trees.
type Change struct {
	Path string `json:"path"`
	Op   string `json:"op"` // added, modified, deleted
	Size int64  `json:"size"`
}

// Diff lists the changes from a to b, two writable layers over the same lower layers; inLower
// reports whether a path exists below them (so that a layer losing its copy of a file means
// the lower version is back rather than the file being gone). Paths are absolute.
func Diff(a, b Tree, inLower func(p string) bool) []Change {
	ia, ib := a.Index(), b.Index()
	var out []Change
	add := func(p, op string, size int64) { out = append(out, Change{Path: "/" + p, Op: op, Size: size}) }
	for _, eb := range b.Entries {
		ea, ok := ia[eb.Path]
		switch {
		case !ok && eb.Whiteout():
			if inLower(eb.Path) {
				add(eb.Path, "deleted", 0)
			}
		case !ok && inLower(eb.Path):
			if eb.Type != "d" {
				add(eb.Path, "modified", eb.Size)
			}
		case !ok:
			add(eb.Path, "added", eb.Size)
		case eb.Whiteout() && !ea.Whiteout():
			add(eb.Path, "deleted", ea.Size)
		case !eb.Whiteout() && ea.Whiteout():
			add(eb.Path, "added", eb.Size)
		case eb.Type != ea.Type:
			add(eb.Path, "modified", eb.Size)
		case eb.Type != "d" && !sameContent(ea, eb):
			add(eb.Path, "modified", eb.Size)
		}
	}
	for _, ea := range a.Entries {
		if _, ok := ib[ea.Path]; ok {
			continue
		}
		if ea.Whiteout() {
			if inLower(ea.Path) {
				add(ea.Path, "added", 0) // the lower version is visible again
			}
			continue
		}
		if inLower(ea.Path) {
			if ea.Type != "d" {
				add(ea.Path, "modified", ea.Size) // back to the lower version
			}
		} else {
			add(ea.Path, "deleted", ea.Size)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func sameContent(a, b Entry) bool {
	if a.Mode != b.Mode || a.UID != b.UID || a.GID != b.GID || a.Target != b.Target || a.Size != b.Size || len(a.Chunks) != len(b.Chunks) {
		return false
	}
	for i := range a.Chunks {
		if a.Chunks[i] != b.Chunks[i] {
			return false
		}
	}
	return true
}

// entryJSON is Entry as stored. JSON strings hold only UTF-8, and file names and link targets
// are any bytes but NUL (and '/' in names): those that are not UTF-8 are stored base64-encoded
// in their own fields instead, so that a capture written back has the very names it had.
type entryJSON struct {
	entryAlias
	PathB64   []byte `json:"pb,omitempty"`
	TargetB64 []byte `json:"lb,omitempty"`
}

type entryAlias Entry

// MarshalJSON implements json.Marshaler.
func (e Entry) MarshalJSON() ([]byte, error) {
	j := entryJSON{entryAlias: entryAlias(e)}
	if !utf8.ValidString(e.Path) {
		j.Path, j.PathB64 = "", []byte(e.Path)
	}
	if !utf8.ValidString(e.Target) {
		j.Target, j.TargetB64 = "", []byte(e.Target)
	}
	return json.Marshal(j)
}

// UnmarshalJSON implements json.Unmarshaler.
func (e *Entry) UnmarshalJSON(b []byte) error {
	var j entryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*e = Entry(j.entryAlias)
	if j.PathB64 != nil {
		e.Path = string(j.PathB64)
	}
	if j.TargetB64 != nil {
		e.Target = string(j.TargetB64)
	}
	return nil
}
