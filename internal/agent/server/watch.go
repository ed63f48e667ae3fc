package server

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	fspb "github.com/space-sandbox/space/internal/agentpb/filesystem"
	"github.com/space-sandbox/space/internal/errdefs"
)

// fsEvent is one change, named relative to the watched directory.
type fsEvent struct {
	name string
	op   fspb.EventType
}

// rawInotify is one record of the inotify read buffer.
type rawInotify struct {
	wd     int32
	mask   uint32
	cookie uint32
	name   string
}

// parseInotify decodes the records of one read(2) from an inotify descriptor: struct
// inotify_event {int wd; u32 mask, cookie, len; char name[len]} in native byte order, name
// NUL-padded. A truncated record is an error; records before it are returned.
func parseInotify(b []byte) ([]rawInotify, error) {
	const hdr = unix.SizeofInotifyEvent
	var out []rawInotify
	for len(b) > 0 {
		if len(b) < hdr {
			return out, fmt.Errorf("inotify: truncated header (%d bytes)", len(b))
		}
		ev := rawInotify{
			wd:     int32(binary.NativeEndian.Uint32(b[0:4])),
			mask:   binary.NativeEndian.Uint32(b[4:8]),
			cookie: binary.NativeEndian.Uint32(b[8:12]),
		}
		n := binary.NativeEndian.Uint32(b[12:16])
		if uint64(n) > uint64(len(b)-hdr) {
			return out, fmt.Errorf("inotify: name length %d exceeds buffer", n)
		}
		name := b[hdr : hdr+int(n)]
		if i := strings.IndexByte(string(name), 0); i >= 0 {
			name = name[:i]
		}
		ev.name = string(name)
		out = append(out, ev)
		b = b[hdr+int(n):]
	}
	return out, nil
}

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// inotifyWatcher watches one directory (and, if recursive, every directory below it, including
// ones created later) and delivers events on its events channel, which closes when the watcher
// ends: on close, or when the watched directory itself is removed or moved away.
type inotifyWatcher struct {
	root      string
	recursive bool
	log       *slog.Logger
	events    chan fsEvent
	done      chan struct{}
	once      sync.Once

	mu     sync.Mutex
	fd     int // raw descriptor for add/rm watch; reads go through f (polled)
	f      *os.File
	closed bool
	wds    map[int32]string // watch descriptor -> directory relative to root ("" is root)
}

func newInotifyWatcher(root string, recursive bool, log *slog.Logger) (*inotifyWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	w := &inotifyWatcher{
		root: root, recursive: recursive, log: log, fd: fd,
		f:      os.NewFile(uintptr(fd), "inotify"),
		events: make(chan fsEvent, 256), done: make(chan struct{}), wds: map[int32]string{},
	}
	if err := w.addWatch(""); err != nil {
		_ = w.f.Close()
		return nil, fsError(err)
	}
	if recursive {
		w.addTree("", false)
	}
	go w.run()
	return w, nil
}

func (w *inotifyWatcher) addWatch(rel string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("watcher closed")
	}
	wd, err := unix.InotifyAddWatch(w.fd, filepath.Join(w.root, rel), watchMask|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: filepath.Join(w.root, rel), Err: err}
	}
	w.wds[int32(wd)] = rel
	return nil
}

// addTree watches every directory below rel; with emit it also reports what it finds as
// created, since those entries may have appeared before their directory was watched.
func (w *inotifyWatcher) addTree(rel string, emit bool) {
	ents, err := os.ReadDir(filepath.Join(w.root, rel))
	if err != nil {
		return
	}
	for _, e := range ents {
		name := filepath.Join(rel, e.Name())
		if emit && !w.emit(fsEvent{name: name, op: fspb.EventType_EVENT_TYPE_CREATE}) {
			return
		}
		if e.IsDir() {
			if err := w.addWatch(name); err == nil {
				w.addTree(name, emit)
			}
		}
	}
}

// dropTree forgets the watches of rel and everything below it (it moved away).
func (w *inotifyWatcher) dropTree(rel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	for wd, r := range w.wds {
		if r == rel || strings.HasPrefix(r, rel+"/") {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.wds, wd)
		}
	}
}

func (w *inotifyWatcher) emit(ev fsEvent) bool {
	select {
	case w.events <- ev:
		return true
	case <-w.done:
		return false
	}
}

func (w *inotifyWatcher) run() {
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		recs, err := parseInotify(buf[:n])
		if err != nil {
			w.log.Warn("inotify", "err", err)
		}
		for _, r := range recs {
			if !w.handle(r) {
				return
			}
		}
	}
}

// handle turns one record into events; it returns false when the watcher should end.
func (w *inotifyWatcher) handle(r rawInotify) bool {
	if r.mask&unix.IN_Q_OVERFLOW != 0 {
		w.log.Warn("inotify queue overflow; events lost", "root", w.root)
		return true
	}
	w.mu.Lock()
	rel, ok := w.wds[r.wd]
	if r.mask&unix.IN_IGNORED != 0 {
		delete(w.wds, r.wd)
	}
	w.mu.Unlock()
	if !ok {
		return true
	}
	if r.mask&unix.IN_IGNORED != 0 {
		return rel != "" // the root watch is gone: end
	}
	if r.name == "" { // an event on a watched directory itself
		if rel != "" {
			return true // its parent reports it
		}
		switch {
		case r.mask&unix.IN_DELETE_SELF != 0:
			return w.emit(fsEvent{name: "", op: fspb.EventType_EVENT_TYPE_REMOVE})
		case r.mask&unix.IN_MOVE_SELF != 0:
			w.emit(fsEvent{name: "", op: fspb.EventType_EVENT_TYPE_RENAME})
			return false // the path no longer names what we watch
		}
		return true
	}
	name := filepath.Join(rel, r.name)
	isDir := r.mask&unix.IN_ISDIR != 0
	var op fspb.EventType
	switch {
	case r.mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		op = fspb.EventType_EVENT_TYPE_CREATE
	case r.mask&unix.IN_MODIFY != 0:
		op = fspb.EventType_EVENT_TYPE_WRITE
	case r.mask&unix.IN_DELETE != 0:
		op = fspb.EventType_EVENT_TYPE_REMOVE
	case r.mask&unix.IN_MOVED_FROM != 0:
		op = fspb.EventType_EVENT_TYPE_RENAME
	case r.mask&unix.IN_ATTRIB != 0:
		op = fspb.EventType_EVENT_TYPE_CHMOD
	default:
		return true
	}
	if !w.emit(fsEvent{name: name, op: op}) {
		return false
	}
	if w.recursive && isDir {
		switch op {
		case fspb.EventType_EVENT_TYPE_CREATE:
			if err := w.addWatch(name); err == nil {
				w.addTree(name, true)
			}
		case fspb.EventType_EVENT_TYPE_RENAME:
			w.dropTree(name)
		}
	}
	return true
}

// close stops the watcher; its events channel closes soon after. Idempotent.
func (w *inotifyWatcher) close() {
	w.once.Do(func() {
		close(w.done)
		w.mu.Lock()
		w.closed = true
		_ = w.f.Close() // unblocks the polled read
		w.mu.Unlock()
	})
}

// watcherSet holds the watchers of the polling API (CreateWatcher / GetWatcherEvents /
// RemoveWatcher). Each buffers at most defaultWatcherQueueSize events, dropping the oldest.
type watcherSet struct {
	mu sync.Mutex
	m  map[string]*polledWatcher
}

type polledWatcher struct {
	w      *inotifyWatcher
	mu     sync.Mutex
	events []*fspb.FilesystemEvent
}

func newWatcherSet() *watcherSet { return &watcherSet{m: map[string]*polledWatcher{}} }

func (ws *watcherSet) add(s *Server, root string, w *inotifyWatcher, withEntry bool) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	pw := &polledWatcher{w: w}
	ws.mu.Lock()
	ws.m[id] = pw
	ws.mu.Unlock()
	go func() {
		for ev := range w.events {
			e := s.eventProto(root, ev, withEntry)
			pw.mu.Lock()
			if len(pw.events) >= defaultWatcherQueueSize {
				pw.events = pw.events[1:]
			}
			pw.events = append(pw.events, e)
			pw.mu.Unlock()
		}
	}()
	return id
}

func (ws *watcherSet) drain(id string) ([]*fspb.FilesystemEvent, error) {
	ws.mu.Lock()
	pw := ws.m[id]
	ws.mu.Unlock()
	if pw == nil {
		return nil, errdefs.NotFound(fmt.Sprintf("watcher %q not found", id))
	}
	pw.mu.Lock()
	defer pw.mu.Unlock()
	evs := pw.events
	pw.events = nil
	return evs, nil
}

func (ws *watcherSet) remove(id string) error {
	ws.mu.Lock()
	pw := ws.m[id]
	delete(ws.m, id)
	ws.mu.Unlock()
	if pw == nil {
		return errdefs.NotFound(fmt.Sprintf("watcher %q not found", id))
	}
	pw.w.close()
	return nil
}

func (ws *watcherSet) closeAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for id, pw := range ws.m {
		pw.w.close()
		delete(ws.m, id)
	}
}
