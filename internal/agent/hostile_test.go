package agent_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/space-sandbox/space/internal/agent"
	fspb "github.com/space-sandbox/space/internal/agentpb/filesystem"
	"github.com/space-sandbox/space/internal/agentpb/filesystem/filesystemconnect"
	"github.com/space-sandbox/space/internal/errdefs"
)

// hugeLister is a server a sandbox could run in the agent's place: it answers a listing with a
// message far larger than any real directory's.
type hugeLister struct {
	filesystemconnect.UnimplementedFilesystemHandler
}

func (hugeLister) ListDir(context.Context, *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	name := strings.Repeat("n", 1<<20)
	resp := &fspb.ListDirResponse{}
	for range 40 { // 40 MiB
		resp.Entries = append(resp.Entries, &fspb.EntryInfo{Name: name, Path: "/" + name})
	}
	return connect.NewResponse(resp), nil
}

// TestHostileAgentAnswerIsBounded: what an agent answers is an attacker's; a message past the
// client's bound is an error, not a buffer of any size in spaced.
func TestHostileAgentAnswerIsBounded(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(filesystemconnect.NewFilesystemHandler(hugeLister{}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := agent.NewClient(srv.URL, "", nil)
	entries, err := c.ListDir(t.Context(), "/", 1)
	if err == nil {
		t.Fatalf("a 40 MiB answer was taken whole (%d entries)", len(entries))
	}
	if !errors.Is(err, errdefs.ErrUpstream) {
		t.Fatalf("a 40 MiB answer: %v, want ErrUpstream (the agent failed, not the caller)", err)
	}
}
