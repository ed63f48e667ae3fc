package fstree

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/confine"
)

// Layer is one layer of an overlay stack. Paths are slash-separated and relative; "" is the root.
type Layer interface {
	Lookup(p string) (Entry, bool, error)
	List(dir string) ([]string, error)
}

type treeLayer struct {
	idx  map[string]Entry
	kids map[string][]string
}

// TreeLayer is a captured tree as a layer.
func TreeLayer(t Tree) Layer {
	l := treeLayer{idx: t.Index(), kids: map[string][]string{}}
	for _, e := range t.Entries {
		d := path.Dir(e.Path)
		if d == "." {
			d = ""
		}
		l.kids[d] = append(l.kids[d], path.Base(e.Path))
	}
	return l
}

func (l treeLayer) Lookup(p string) (Entry, bool, error) {
	if p == "" {
		return Entry{Type: "d", Mode: 0o755}, true, nil
	}
	e, ok := l.idx[p]
	return e, ok, nil
}

func (l treeLayer) List(dir string) ([]string, error) { return l.kids[dir], nil }

// dirLayer remembers what it looked up: a view asks about every ancestor of every path it
// visits, and a deep tree would otherwise cost a resolution per ancestor per path.
type dirLayer struct {
	dir   string
	cache map[string]dirHit
}

type dirHit struct {
	e  Entry
	ok bool
}

// DirLayer is a host directory (a template's root or layer) as a layer. Images and template
// builds wrote it, so it is read through confine: its links (Debian's /var/run -> /run, an
// image's hostroot -> /) are entries of the view, never followed on the host.
func DirLayer(dir string) Layer { return &dirLayer{dir: dir, cache: map[string]dirHit{}} }

func (l *dirLayer) Lookup(p string) (Entry, bool, error) {
	if h, ok := l.cache[p]; ok {
		return h.e, h.ok, nil
	}
	e, ok, err := l.lookup(p)
	if err == nil {
		l.cache[p] = dirHit{e, ok}
	}
	return e, ok, err
}

func (l *dirLayer) lookup(p string) (Entry, bool, error) {
	root, err := confine.Open(l.dir)
	if err != nil {
		return Entry{}, false, err
	}
	defer root.Close()
	if p == "" {
		return Entry{Type: "d", Mode: 0o755}, true, nil
	}
	var res Entry
	err = root.Walk(p, func(ce confine.Entry) error {
		e, err := entryOf(ce)
		if err != nil {
			return err
		}
		e.layer = l.dir
		res = e
		return fs.SkipDir
	})
	// A missing path, or one under something that is not a directory in this layer (a link is
	// one to the sandbox, resolved in its view; hidden() sees it as a non-directory that hides
	// what is below), is not in the layer.
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, confine.ErrSymlink) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, err
	}
	return res, res.Type != "", nil
}

func (l *dirLayer) List(dir string) ([]string, error) {
	root, err := confine.Open(l.dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	names, err := root.ReadDir(dir)
	if err != nil {
		return nil, nil // not a directory in this layer
	}
	out := make([]string, 0, len(names))
	for _, e := range names {
		out = append(out, e.Name)
	}
	return out, nil
}

// View is a stack of layers, the top first, read the way overlayfs merges them. It remembers
// which directories of each layer hide what is below them, so a path costs one look at its
// parent rather than at every ancestor. Not safe for concurrent use.
type View struct {
	layers []Layer
	hides  []map[string]bool // per layer: directory → it or an ancestor hides the layers below
}

// NewView stacks layers, the topmost first.
func NewView(layers ...Layer) *View {
	v := &View{layers: layers, hides: make([]map[string]bool, len(layers))}
	for i := range v.hides {
		v.hides[i] = map[string]bool{}
	}
	return v
}

// hidden reports whether something in layer i above p (an ancestor that is deleted, not a
// directory, or opaque) hides p in the layers below it.
func (v *View) hidden(i int, p string) (bool, error) { return v.hiddenDir(i, parentOf(p)) }

// hiddenDir reports whether directory a of layer i, or one of its ancestors, hides the layers
// below.
func (v *View) hiddenDir(i int, a string) (bool, error) {
	if a == "" {
		return false, nil
	}
	if h, ok := v.hides[i][a]; ok {
		return h, nil
	}
	e, ok, err := v.layers[i].Lookup(a)
	if err != nil {
		return false, err
	}
	h := ok && (e.Whiteout() || e.Type != "d" || e.Opaque())
	if !h {
		if h, err = v.hiddenDir(i, parentOf(a)); err != nil {
			return false, err
		}
	}
	v.hides[i][a] = h
	return h, nil
}

// parentOf is p's parent in the relative form ("" for the root): a slice of p, no copy.
func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

// Lookup returns what p is in the merged view.
func (v *View) Lookup(p string) (Entry, bool, error) {
	for i, l := range v.layers {
		e, ok, err := l.Lookup(p)
		if err != nil {
			return Entry{}, false, err
		}
		if ok {
			if e.Whiteout() {
				return Entry{}, false, nil
			}
			e.Path = p
			return e, true, nil
		}
		if h, err := v.hidden(i, p); err != nil || h {
			return Entry{}, false, err
		}
	}
	return Entry{}, false, nil
}

// List returns the names in directory dir of the merged view, sorted.
func (v *View) List(dir string) ([]string, error) {
	seen := map[string]bool{}
	for i, l := range v.layers {
		e, ok, err := l.Lookup(dir)
		if err != nil {
			return nil, err
		}
		if ok && e.Type != "d" {
			break
		}
		if ok {
			names, err := l.List(dir)
			if err != nil {
				return nil, err
			}
			for _, n := range names {
				seen[n] = true
			}
			if e.Opaque() {
				break
			}
		}
		if dir != "" {
			if h, err := v.hidden(i, dir); err != nil || h {
				if err != nil {
					return nil, err
				}
				break
			}
		}
	}
	var out []string
	for n := range seen {
		if _, ok, err := v.Lookup(path.Join(dir, n)); err != nil {
			return nil, err
		} else if ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Walk calls fn for p and everything under it in the merged view, parents first. A p the view
// does not have calls nothing.
func (v *View) Walk(p string, fn func(Entry) error) error {
	e, ok, err := v.Lookup(p)
	if err != nil || !ok {
		return err
	}
	if err := fn(e); err != nil {
		return err
	}
	if e.Type != "d" {
		return nil
	}
	names, err := v.List(p)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := v.Walk(path.Join(p, n), fn); err != nil {
			return err
		}
	}
	return nil
}

// CleanAbs turns an absolute sandbox path into the relative form trees use.
func CleanAbs(p string) (string, error) {
	if !path.IsAbs(p) || strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", fmt.Errorf("path %q: want an absolute path", p)
	}
	c := strings.TrimPrefix(path.Clean(p), "/")
	if c == "" {
		return "", fmt.Errorf("path %q: the whole root cannot be restored by path; restore without paths", p)
	}
	return c, nil
}

// WriteTar writes, as a tar stream with names relative to the root, everything the view holds
// at and under each of paths (relative form).
func WriteTar(w io.Writer, s ChunkSource, v *View, paths []string) error {
	tw := tar.NewWriter(w)
	for _, p := range paths {
		err := v.Walk(p, func(e Entry) error {
			hdr := &tar.Header{
				Name: e.Path, Mode: int64(e.Mode), Uid: e.UID, Gid: e.GID,
				ModTime: time.Unix(0, e.MTime), Format: tar.FormatPAX,
			}
			switch e.Type {
			case "f":
				hdr.Typeflag, hdr.Size = tar.TypeReg, e.Size
			case "d":
				hdr.Typeflag, hdr.Name = tar.TypeDir, e.Path+"/"
			case "l":
				hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Target
			case "p":
				hdr.Typeflag = tar.TypeFifo
			default:
				return nil // devices are not restored by path
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if e.Type != "f" {
				return nil
			}
			r, err := Open(s, e)
			if err != nil {
				return err
			}
			defer r.Close()
			n, err := io.Copy(tw, io.LimitReader(r, e.Size))
			if err == nil && n != e.Size {
				err = fmt.Errorf("%s: %d of %d bytes", e.Path, n, e.Size)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return tw.Close()
}
