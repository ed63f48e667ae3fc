package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent/server"
)

const token = "wire-token"

// serve starts an agent on 127.0.0.1:0 whose root user has the test's uid and home dir.
func serve(t *testing.T) (url, home string) {
	t.Helper()
	home, etc := t.TempDir(), t.TempDir()
	passwd := fmt.Sprintf("root:x:%d:%d:root:%s:/bin/sh\n", os.Getuid(), os.Getgid(), home)
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Token: token, PasswdPath: filepath.Join(etc, "passwd"), GroupPath: filepath.Join(etc, "group"),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	return "http://" + ln.Addr().String(), home
}

func post(t *testing.T, url, ctype string, hdr map[string]string, body []byte) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Connect-Protocol-Version", "1")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// envelope frames one Connect streaming message.
func envelope(flags byte, payload []byte) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

type frame struct {
	flags byte
	data  []byte
}

func readFrame(r *bufio.Reader) (frame, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	data := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(r, data); err != nil {
		return frame{}, err
	}
	return frame{hdr[0], data}, nil
}

// TestE2BUnaryJSON calls ListDir the way connect-web does: a plain JSON POST.
func TestE2BUnaryJSON(t *testing.T) {
	url, home := serve(t)
	if err := os.WriteFile(filepath.Join(home, "hello.txt"), []byte("12345678"), 0o644); err != nil {
		t.Fatal(err)
	}
	resp := post(t, url+"/filesystem.Filesystem/ListDir", "application/json",
		map[string]string{"X-Access-Token": token, "Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("root:"))},
		[]byte(`{"path":"`+home+`","depth":1}`))
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("status %d type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var got struct {
		Entries []map[string]any `json:"entries"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != 1 {
		t.Fatalf("entries %s", body)
	}
	e := got.Entries[0]
	checks := map[string]any{
		"name": "hello.txt", "type": "FILE_TYPE_FILE", "path": filepath.Join(home, "hello.txt"),
		"size": "8", "permissions": "-rw-r--r--", "mode": float64(0o100644),
	}
	for k, want := range checks {
		if e[k] != want {
			t.Errorf("%s = %#v, want %#v (entry %s)", k, e[k], want, body)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(e["modifiedTime"])); err != nil {
		t.Errorf("modifiedTime %v: %v", e["modifiedTime"], err)
	}

	// Errors are Connect JSON with a code string and the right HTTP status.
	tests := []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		code             string
	}{
		{"missing dir", "/filesystem.Filesystem/ListDir", `{"path":"/no/such/dir"}`, map[string]string{"X-Access-Token": token}, 404, "not_found"},
		{"bad token", "/filesystem.Filesystem/ListDir", `{"path":"/"}`, map[string]string{"X-Access-Token": "x"}, 401, "unauthenticated"},
		{"unknown user", "/filesystem.Filesystem/Stat", `{"path":"/"}`, map[string]string{"X-Access-Token": token,
			"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("nobody-here:"))}, 400, "invalid_argument"},
		{"mkdir exists", "/filesystem.Filesystem/MakeDir", `{"path":"` + home + `"}`, map[string]string{"X-Access-Token": token}, 409, "already_exists"},
		{"unknown pid", "/process.Process/SendSignal", `{"process":{"pid":999999},"signal":"SIGNAL_SIGKILL"}`, map[string]string{"X-Access-Token": token}, 404, "not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, url+tc.path, "application/json", tc.hdr, []byte(tc.body))
			var ce struct{ Code, Message string }
			b, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(b, &ce); err != nil || resp.StatusCode != tc.status || ce.Code != tc.code || ce.Message == "" {
				t.Fatalf("status %d body %s, want %d %s", resp.StatusCode, b, tc.status, tc.code)
			}
		})
	}
}

// TestE2BStreamJSON runs Process.Start as connect-web does: one connect+json envelope in,
// envelopes out, first {"event":{"start":...}}, data in base64, end, then an end-stream frame.
func TestE2BStreamJSON(t *testing.T) {
	url, home := serve(t)
	req := `{"process":{"cmd":"/bin/sh","args":["-c","sleep 1.3; echo out; echo err >&2; pwd; exit 3"],"envs":{"A":"b"}},"stdin":false}`
	resp := post(t, url+"/process.Process/Start", "application/connect+json",
		map[string]string{"X-Access-Token": token, "Keepalive-Ping-Interval": "1", "Connect-Timeout-Ms": "60000"},
		envelope(0, []byte(req)))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	type event struct {
		Event struct {
			Start *struct {
				Pid int `json:"pid"`
			} `json:"start"`
			Data *struct {
				Stdout []byte `json:"stdout"`
				Stderr []byte `json:"stderr"`
			} `json:"data"`
			End *struct {
				ExitCode int    `json:"exitCode"`
				Exited   bool   `json:"exited"`
				Status   string `json:"status"`
			} `json:"end"`
			Keepalive *struct{} `json:"keepalive"`
		} `json:"event"`
	}
	var msgs []event
	var raw []string
	var endStream *frame
	for {
		f, err := readFrame(r)
		if err != nil {
			break
		}
		if f.flags&0x02 != 0 {
			endStream = &f
			break
		}
		var ev event
		if err := json.Unmarshal(f.data, &ev); err != nil {
			t.Fatalf("frame %q: %v", f.data, err)
		}
		msgs = append(msgs, ev)
		raw = append(raw, string(f.data))
	}
	if len(msgs) == 0 || msgs[0].Event.Start == nil || msgs[0].Event.Start.Pid <= 0 {
		t.Fatalf("first message is not a start event: %v", raw)
	}
	if !strings.HasPrefix(raw[0], `{"event":{"start":{"pid":`) {
		t.Errorf("start message %s", raw[0])
	}
	var stdout, stderr string
	keepalives := 0
	for _, m := range msgs[1 : len(msgs)-1] {
		switch {
		case m.Event.Data != nil:
			stdout += string(m.Event.Data.Stdout)
			stderr += string(m.Event.Data.Stderr)
		case m.Event.Keepalive != nil:
			keepalives++
		default:
			t.Errorf("unexpected message in the middle: %v", raw)
		}
	}
	if stdout != "out\n"+home+"\n" || stderr != "err\n" {
		t.Errorf("stdout %q stderr %q", stdout, stderr)
	}
	if keepalives == 0 {
		t.Errorf("no keepalive during 1.3 s idle with a 1 s interval: %v", raw)
	}
	last := msgs[len(msgs)-1].Event.End
	if last == nil || last.ExitCode != 3 || !last.Exited || last.Status != "exit status 3" {
		t.Fatalf("last message is not the end event: %s", raw[len(raw)-1])
	}
	if endStream == nil || strings.TrimSpace(string(endStream.data)) != "{}" {
		t.Fatalf("no clean end-stream frame: %+v", endStream)
	}
}

// An error of a streaming call arrives in the end-stream frame with HTTP 200.
func TestE2BStreamJSONError(t *testing.T) {
	url, _ := serve(t)
	resp := post(t, url+"/process.Process/Connect", "application/connect+json",
		map[string]string{"X-Access-Token": token}, envelope(0, []byte(`{"process":{"pid":999999}}`)))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	f, err := readFrame(bufio.NewReader(resp.Body))
	if err != nil {
		t.Fatal(err)
	}
	var es struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if f.flags&0x02 == 0 || json.Unmarshal(f.data, &es) != nil || es.Error.Code != "not_found" {
		t.Fatalf("frame flags %#x data %s", f.flags, f.data)
	}
}

func TestHealthNeedsNoToken(t *testing.T) {
	url, _ := serve(t)
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
}
