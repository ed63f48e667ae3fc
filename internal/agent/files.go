package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	fspb "github.com/space-sandbox/space/internal/agentpb/filesystem"
	"github.com/space-sandbox/space/internal/errdefs"
)

// Entry describes one file in the sandbox. Type is "file", "dir", "symlink" or "other".
type Entry struct {
	Name          string
	Path          string
	Type          string
	Size          int64
	Mode          os.FileMode
	ModifiedAt    time.Time
	SymlinkTarget string
}

func (c *Client) filesURL(path, user string, extra url.Values) string {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	for k, v := range extra {
		q[k] = v
	}
	return c.base + "/files?" + q.Encode()
}

// Upload streams r into the file at path (parents created; relative paths are relative to the
// user's home) with mode (0: keep the replaced file's mode, else 0644), owned by user. The
// body is sent as it is read; nothing is buffered whole.
func (c *Client) Upload(ctx context.Context, path string, mode os.FileMode, user string, r io.Reader) (Entry, error) {
	extra := url.Values{}
	if mode != 0 {
		extra.Set("mode", "0"+strconv.FormatUint(uint64(unixPerm(mode)), 8))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.filesURL(path, user, extra), io.NopCloser(r))
	if err != nil {
		return Entry{}, fmt.Errorf("upload %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	c.setHeaders(req.Header, "")
	resp, err := c.hc.Do(req)
	if err != nil {
		return Entry{}, transportError("upload "+path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return Entry{}, httpError(resp)
	}
	var entries []struct {
		Name, Type, Path string
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&entries); err != nil || len(entries) == 0 {
		return Entry{}, fmt.Errorf("upload %s: unexpected response: %w", path, errdefs.ErrUnavailable)
	}
	return c.Stat(ctx, entries[0].Path)
}

// Download opens the file at path for reading, as user (relative paths are relative to the
// user's home). It returns the body, to be closed by the caller, and its size (-1 if unknown).
// A directory is ErrInvalidArgument; a missing file ErrNotFound.
func (c *Client) Download(ctx context.Context, path, user string) (io.ReadCloser, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.filesURL(path, user, nil), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("download %s: %w", path, err)
	}
	c.setHeaders(req.Header, "")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, 0, transportError("download "+path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, 0, httpError(resp)
	}
	return resp.Body, resp.ContentLength, nil
}

// Stat describes the file at path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (Entry, error) {
	resp, err := c.fs.Stat(ctx, newRequest(c, &fspb.StatRequest{Path: path}, ""))
	if err != nil {
		return Entry{}, rpcError(err)
	}
	return entryFrom(resp.Msg.GetEntry()), nil
}

// ListDir lists the directory at path to depth levels (0 or 1: its entries only).
func (c *Client) ListDir(ctx context.Context, path string, depth int) ([]Entry, error) {
	if depth < 0 {
		return nil, errdefs.InvalidArgument("list: negative depth")
	}
	resp, err := c.fs.ListDir(ctx, newRequest(c, &fspb.ListDirRequest{Path: path, Depth: uint32(depth)}, ""))
	if err != nil {
		return nil, rpcError(err)
	}
	out := make([]Entry, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		out = append(out, entryFrom(e))
	}
	return out, nil
}

// MakeDir creates a directory and its parents. An existing directory is ErrAlreadyExists.
func (c *Client) MakeDir(ctx context.Context, path string) (Entry, error) {
	resp, err := c.fs.MakeDir(ctx, newRequest(c, &fspb.MakeDirRequest{Path: path}, ""))
	if err != nil {
		return Entry{}, rpcError(err)
	}
	return entryFrom(resp.Msg.GetEntry()), nil
}

// Move renames from to to (creating to's parents) and describes the result.
func (c *Client) Move(ctx context.Context, from, to string) (Entry, error) {
	resp, err := c.fs.Move(ctx, newRequest(c, &fspb.MoveRequest{Source: from, Destination: to}, ""))
	if err != nil {
		return Entry{}, rpcError(err)
	}
	return entryFrom(resp.Msg.GetEntry()), nil
}

// Remove removes path. Recursive removes whole trees and accepts a missing path; otherwise a
// non-empty directory is ErrFailedPrecondition and a missing path ErrNotFound.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := c.fs.Remove(ctx, newRequest(c, &fspb.RemoveRequest{Path: path, NonRecursive: !recursive}, ""))
	return rpcError(err)
}

func entryFrom(e *fspb.EntryInfo) Entry {
	out := Entry{
		Name: e.GetName(), Path: e.GetPath(), Size: e.GetSize(),
		Mode: modeFromUnix(e.GetMode()), SymlinkTarget: e.GetSymlinkTarget(),
	}
	if t := e.GetModifiedTime(); t != nil {
		out.ModifiedAt = t.AsTime()
	}
	switch e.GetType() {
	case fspb.FileType_FILE_TYPE_FILE:
		out.Type = "file"
	case fspb.FileType_FILE_TYPE_DIRECTORY:
		out.Type = "dir"
	case fspb.FileType_FILE_TYPE_SYMLINK:
		out.Type = "symlink"
	default:
		out.Type = "other"
	}
	return out
}

// modeFromUnix converts a unix st_mode to an os.FileMode.
func modeFromUnix(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		mode |= fs.ModeDir
	case syscall.S_IFLNK:
		mode |= fs.ModeSymlink
	case syscall.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		mode |= fs.ModeSocket
	case syscall.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&syscall.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// unixPerm converts the permission and special bits of an os.FileMode to unix bits.
func unixPerm(m os.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		u |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		u |= syscall.S_ISVTX
	}
	return u
}

// FSEvent is one change under a watched directory. Op is "create", "write", "remove",
// "rename" or "chmod"; Name is relative to the watched directory ("" for the directory itself).
type FSEvent struct {
	Name string
	Op   string
}

// WatchStream is a stream of FSEvents.
type WatchStream struct {
	recv   func() (*fspb.WatchDirResponse, error)
	close  func() error
	cancel context.CancelFunc
}

// Watch watches the directory at path (and, if recursive, every directory below it, including
// ones created later). The start event is consumed before Watch returns.
func (c *Client) Watch(ctx context.Context, path string, recursive bool) (*WatchStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	st, err := c.fs.WatchDir(sctx, newRequest(c, &fspb.WatchDirRequest{Path: path, Recursive: recursive}, ""))
	if err != nil {
		cancel()
		return nil, rpcError(err)
	}
	ws := &WatchStream{cancel: cancel, close: st.Close, recv: func() (*fspb.WatchDirResponse, error) {
		if !st.Receive() {
			return nil, st.Err()
		}
		return st.Msg(), nil
	}}
	for {
		msg, err := ws.recv()
		if err != nil || msg == nil {
			_ = ws.Close()
			if err == nil {
				return nil, errdefs.New(errdefs.ErrUnavailable, "agent: watch stream ended before its start event")
			}
			return nil, rpcError(err)
		}
		if msg.GetStart() != nil {
			return ws, nil
		}
	}
}

// Recv returns the next event; io.EOF when the watch ended (the directory went away).
func (s *WatchStream) Recv() (FSEvent, error) {
	for {
		msg, err := s.recv()
		if err != nil {
			return FSEvent{}, rpcError(err)
		}
		if msg == nil {
			return FSEvent{}, io.EOF
		}
		ev := msg.GetFilesystem()
		if ev == nil {
			continue
		}
		return FSEvent{Name: ev.GetName(), Op: opName(ev.GetType())}, nil
	}
}

func opName(t fspb.EventType) string {
	switch t {
	case fspb.EventType_EVENT_TYPE_CREATE:
		return "create"
	case fspb.EventType_EVENT_TYPE_WRITE:
		return "write"
	case fspb.EventType_EVENT_TYPE_REMOVE:
		return "remove"
	case fspb.EventType_EVENT_TYPE_RENAME:
		return "rename"
	case fspb.EventType_EVENT_TYPE_CHMOD:
		return "chmod"
	}
	return "unknown"
}

// Close ends the watch.
func (s *WatchStream) Close() error {
	s.cancel()
	return s.close()
}
