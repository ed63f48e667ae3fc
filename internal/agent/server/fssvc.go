package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/space-sandbox/space/internal/agentpb/filesystem"
	"github.com/space-sandbox/space/internal/agentpb/filesystem/filesystemconnect"
	"github.com/space-sandbox/space/internal/errdefs"
)

// filesystemService implements filesystem.Filesystem. Paths are absolute or relative to the
// calling user's home; entries describe files without following a final symlink.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	p, err := resolvePath(userFrom(ctx), req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	e, err := f.s.statEntry(p)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its parents, owned by the calling user. An existing
// directory is already_exists; an existing non-directory is invalid_argument.
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	u := userFrom(ctx)
	p, err := resolvePath(u, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory already exists: %s", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path already exists but is not a directory: %s", p))
	}
	if err := mkdirAllOwned(p, u); err != nil {
		return nil, connectErr(err)
	}
	e, err := f.s.statEntry(p)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating the destination's parents; across file systems
// it copies and then removes the source.
func (f *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	u := userFrom(ctx)
	src, err := resolvePath(u, req.Msg.GetSource())
	if err != nil {
		return nil, connectErr(err)
	}
	dst, err := resolvePath(u, req.Msg.GetDestination())
	if err != nil {
		return nil, connectErr(err)
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, connectErr(fsError(err))
	}
	if err := mkdirAllOwned(filepath.Dir(dst), u); err != nil {
		return nil, connectErr(err)
	}
	if err := os.Rename(src, dst); err != nil {
		if !errors.Is(err, syscall.EXDEV) {
			return nil, connectErr(fsError(err))
		}
		if err := moveAcross(src, dst); err != nil {
			return nil, connectErr(fsError(err))
		}
	}
	e, err := f.s.statEntry(dst)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

func moveAcross(src, dst string) error {
	if fi, err := os.Lstat(dst); err == nil {
		if fi.IsDir() {
			return &fs.PathError{Op: "rename", Path: dst, Err: syscall.EEXIST}
		}
		if err := os.Remove(dst); err != nil {
			return err
		}
	}
	if err := copyTree(src, dst); err != nil {
		_ = os.RemoveAll(dst)
		return err
	}
	return os.RemoveAll(src)
}

// ListDir lists a directory (following the symlink if the path itself is one) to the given
// depth (default 1), without following symlinks below it.
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	p, err := resolvePath(userFrom(ctx), req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth <= 0 {
		depth = 1
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, connectErr(fsError(err))
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path is not a directory: %s", p))
	}
	var entries []*fspb.EntryInfo
	if err := f.s.walk(p, depth, true, &entries); err != nil {
		return nil, connectErr(fsError(err))
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: entries}), nil
}

func (s *Server) walk(dir string, depth int, top bool, out *[]*fspb.EntryInfo) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if top {
			return err
		}
		return nil // an unreadable subdirectory is listed but not descended into
	}
	for _, de := range ents {
		fi, err := de.Info()
		if err != nil {
			continue // vanished meanwhile
		}
		p := filepath.Join(dir, de.Name())
		*out = append(*out, s.entryInfo(p, fi))
		if depth > 1 && de.IsDir() {
			if err := s.walk(p, depth-1, false, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Remove removes a file or a whole tree; a missing path is not an error (as in envd). With the
// non_recursive extension it removes only files and empty directories: a non-empty directory
// is failed_precondition and a missing path not_found.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	p, err := resolvePath(userFrom(ctx), req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if req.Msg.GetNonRecursive() {
		if err := os.Remove(p); err != nil {
			if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
				return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("directory not empty: %s", p))
			}
			return nil, connectErr(fsError(err))
		}
	} else if err := os.RemoveAll(p); err != nil {
		return nil, connectErr(fsError(err))
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// WatchDir streams changes below a directory: first start, then filesystem events (names
// relative to the directory) and keepalives when idle. It ends when the directory goes away.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	p, err := f.watchPath(ctx, req.Msg.GetPath())
	if err != nil {
		return connectErr(err)
	}
	w, err := newInotifyWatcher(p, req.Msg.GetRecursive(), f.s.log)
	if err != nil {
		return connectErr(err)
	}
	defer w.close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	interval := keepaliveInterval(req.Header(), f.s.cfg.Keepalive)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		var msg *fspb.WatchDirResponse
		select {
		case ev, ok := <-w.events:
			if !ok {
				return nil
			}
			msg = &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{
				Filesystem: f.s.eventProto(p, ev, req.Msg.GetIncludeEntry())}}
		case <-timer.C:
			msg = &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}
		case <-ctx.Done():
			return connectErr(ctx.Err())
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		timer.Reset(interval)
	}
}

func (f *filesystemService) watchPath(ctx context.Context, path string) (string, error) {
	p, err := resolvePath(userFrom(ctx), path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fsError(err)
	}
	if !fi.IsDir() {
		return "", errdefs.InvalidArgument(fmt.Sprintf("path is not a directory: %s", p))
	}
	return p, nil
}

func (s *Server) eventProto(root string, ev fsEvent, withEntry bool) *fspb.FilesystemEvent {
	out := &fspb.FilesystemEvent{Name: validUTF8(ev.name), Type: ev.op}
	if withEntry {
		if e, err := s.statEntry(filepath.Join(root, ev.name)); err == nil {
			out.Entry = e
		}
	}
	return out
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	p, err := f.watchPath(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	w, err := newInotifyWatcher(p, req.Msg.GetRecursive(), f.s.log)
	if err != nil {
		return nil, connectErr(err)
	}
	id := f.s.watches.add(f.s, p, w, req.Msg.GetIncludeEntry())
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	evs, err := f.s.watches.drain(req.Msg.GetWatcherId())
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	if err := f.s.watches.remove(req.Msg.GetWatcherId()); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
