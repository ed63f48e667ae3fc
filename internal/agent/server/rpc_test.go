package server_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/space-sandbox/space/internal/agentpb/filesystem"
	"github.com/space-sandbox/space/internal/agentpb/filesystem/filesystemconnect"
	pb "github.com/space-sandbox/space/internal/agentpb/process"
	"github.com/space-sandbox/space/internal/agentpb/process/processconnect"
)

func withToken[T any](msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	r.Header().Set("X-Access-Token", token)
	return r
}

// h2c: the agent speaks HTTP/2 without TLS as well as HTTP/1.1.
func TestH2C(t *testing.T) {
	url, _ := serve(t)
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	resp, err := hc.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("proto %s status %d", resp.Proto, resp.StatusCode)
	}
	fs := filesystemconnect.NewFilesystemClient(hc, url, connect.WithProtoJSON())
	if _, err := fs.Stat(context.Background(), withToken(&fspb.StatRequest{Path: "/"})); err != nil {
		t.Fatal(err)
	}
}

func TestConnectByTagAndStreamInput(t *testing.T) {
	url, _ := serve(t)
	ctx := context.Background()
	pc := processconnect.NewProcessClient(http.DefaultClient, url, connect.WithProtoJSON())
	tag := "worker"
	yes := true
	st, err := pc.Start(ctx, withToken(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "cat"}, Tag: &tag, Stdin: &yes}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	st.Close()

	in := pc.StreamInput(ctx)
	in.RequestHeader().Set("X-Access-Token", token)
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}
	msgs := []*pb.StreamInputRequest{
		{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("abc")}}}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("def\n")}}}}},
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.CloseStdin(ctx, withToken(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	cs, err := pc.Connect(ctx, withToken(&pb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	var end *pb.ProcessEvent_EndEvent
	for cs.Receive() {
		ev := cs.Msg().GetEvent()
		if s := ev.GetStart(); s != nil && s.GetPid() != pid {
			t.Fatalf("connect by tag reached pid %d, want %d", s.GetPid(), pid)
		}
		out = append(out, ev.GetData().GetStdout()...)
		if e := ev.GetEnd(); e != nil {
			end = e
		}
	}
	if cs.Err() != nil || string(out) != "abcdef\n" || end == nil || end.GetExitCode() != 0 {
		t.Fatalf("out %q end %v err %v", out, end, cs.Err())
	}
	cs, err = pc.Connect(ctx, withToken(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "none"}}}))
	if err == nil {
		for cs.Receive() {
		}
		err = cs.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("connect to unknown tag: %v", err)
	}
}

func TestPollingWatcher(t *testing.T) {
	url, home := serve(t)
	ctx := context.Background()
	fc := filesystemconnect.NewFilesystemClient(http.DefaultClient, url)
	resp, err := fc.CreateWatcher(ctx, withToken(&fspb.CreateWatcherRequest{Path: home, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetWatcherId()
	if err := os.WriteFile(filepath.Join(home, "a.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var evs []*fspb.FilesystemEvent
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r, err := fc.GetWatcherEvents(ctx, withToken(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, r.Msg.GetEvents()...)
		if slices.ContainsFunc(evs, func(e *fspb.FilesystemEvent) bool { return e.GetType() == fspb.EventType_EVENT_TYPE_WRITE }) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(evs) < 2 || evs[0].GetName() != "a.txt" || evs[0].GetType() != fspb.EventType_EVENT_TYPE_CREATE ||
		evs[0].GetEntry().GetPath() != filepath.Join(home, "a.txt") {
		t.Fatalf("events %v", evs)
	}
	if _, err := fc.RemoveWatcher(ctx, withToken(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = fc.GetWatcherEvents(ctx, withToken(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher: %v", err)
	}
	if _, err := fc.RemoveWatcher(ctx, withToken(&fspb.RemoveWatcherRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("remove twice: %v", err)
	}
	var ce *connect.Error
	if _, err := fc.CreateWatcher(ctx, withToken(&fspb.CreateWatcherRequest{Path: "/no/such"})); !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound {
		t.Fatalf("watch missing: %v", err)
	}
}
