package snapshot

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/fstree"
)

// Capture records dir into tx, reading again only files changed since prev (nil: every file).
func Capture(tx *cas.Txn, dir string, prev *fstree.Tree) (fstree.Tree, error) {
	if prev == nil {
		return fstree.Capture(tx, dir, nil, time.Time{})
	}
	return fstree.Capture(tx, dir, prev.Index(), prev.CapturedAt)
}

// CaptureRunning records the writable layer dir of a running sandbox, reading again only files
// changed since prev (nil: all). Files written just before the pass would all be read again by
// the frozen pass that follows; a second pass a moment later reads them while the sandbox still
// runs.
func CaptureRunning(tx *cas.Txn, dir string, prev *fstree.Tree) (fstree.Tree, error) {
	first, err := Capture(tx, dir, prev)
	if err != nil {
		return fstree.Tree{}, err
	}
	if first.Racy() {
		time.Sleep(time.Until(first.CapturedAt.Add(fstree.RacyWindow)))
		return Capture(tx, dir, &first)
	}
	return first, nil
}

// Unchanged reports whether files, a capture of a writable layer, holds the same files as the
// filesystem snapshot prev (false if prev is nil or full).
func Unchanged(prev *Manifest, files fstree.Tree) bool {
	return prev != nil && prev.Kind == KindFilesystem && sameFiles(prev.Upper, files)
}

// sameFiles reports whether two captures of a writable layer hold the same files.
func sameFiles(a, b fstree.Tree) bool {
	return len(fstree.Diff(a, b, func(string) bool { return false })) == 0 && len(a.Entries) == len(b.Entries)
}

// CapturePrivate records the shared layers of the sandbox (those of mf.Layers that shared
// says are). They never change, so after the first snapshot that holds them (prev) nothing is
// read again.
func CapturePrivate(tx *cas.Txn, shared func(layer string) bool, prev, mf *Manifest) error {
	for _, l := range mf.Layers {
		if !shared(l) {
			continue
		}
		var last *fstree.Tree
		if prev != nil {
			if t, ok := prev.Private[l]; ok {
				last = &t
			}
		}
		t, err := Capture(tx, l, last)
		if err != nil {
			return fmt.Errorf("shared layer %s: %w", filepath.Base(l), err)
		}
		if mf.Private == nil {
			mf.Private = map[string]fstree.Tree{}
		}
		mf.Private[l] = t
	}
	return nil
}

// CaptureCheckpoint records a checkpoint directory: its upper/ as the writable layer, the rest
// as the runtime's image.
func CaptureCheckpoint(tx *cas.Txn, dir string, mf *Manifest) error {
	all, err := fstree.Capture(tx, dir, nil, time.Time{})
	if err != nil {
		return err
	}
	img := fstree.Tree{CapturedAt: all.CapturedAt}
	mf.Upper = fstree.Tree{CapturedAt: all.CapturedAt}
	for _, e := range all.Entries {
		switch {
		case e.Path == "upper":
		case strings.HasPrefix(e.Path, "upper/"):
			e.Path = strings.TrimPrefix(e.Path, "upper/")
			mf.Upper.Entries = append(mf.Upper.Entries, e)
		default:
			img.Entries = append(img.Entries, e)
		}
	}
	mf.Checkpoint = &img
	return nil
}
