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

	"github.com/space-sandbox/space/internal/cas"
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

type dirLayer string

// DirLayer is a host directory (a template's root or layer) as a layer. Images and template
// builds wrote it, so it is read through confine: its links (Debian's /var/run -> /run, an
// image's hostroot -> /) are entries of the view, never followed on the host.
func DirLayer(dir string) Layer { return dirLayer(dir) }

func (l dirLayer) Lookup(p string) (Entry, bool, error) {
	root, err := confine.Open(string(l))
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
		e.layer = string(l)
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

func (l dirLayer) List(dir string) ([]string, error) {
	root, err := confine.Open(string(l))
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

// View is a stack of layers, the top first, read the way overlayfs merges them.
type View struct{ layers []Layer }

// NewView stacks layers, the topmost first.
func NewView(layers ...Layer) *View { return &View{layers: layers} }

// hidden reports whether something in layer l above p (an ancestor that is deleted, not a
// directory, or opaque) hides p in the layers below l.
func hidden(l Layer, p string) (bool, error) {
	for a := path.Dir(p); a != "." && a != "/" && a != ""; a = path.Dir(a) {
		e, ok, err := l.Lookup(a)
		if err != nil {
			return false, err
		}
		if ok && (e.Whiteout() || e.Type != "d" || e.Opaque()) {
			return true, nil
		}
	}
	return false, nil
}

// Lookup returns what p is in the merged view.
func (v *View) Lookup(p string) (Entry, bool, error) {
	for _, l := range v.layers {
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
		if h, err := hidden(l, p); err != nil || h {
			return Entry{}, false, err
		}
	}
	return Entry{}, false, nil
}

// List returns the names in directory dir of the merged view, sorted.
func (v *View) List(dir string) ([]string, error) {
	seen := map[string]bool{}
	for _, l := range v.layers {
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
			if h, err := hidden(l, dir); err != nil || h {
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
func WriteTar(w io.Writer, s *cas.Store, v *View, paths []string) error {
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
