package agent_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/errdefs"
)

// patternReader yields n pseudo-random bytes without holding them.
type patternReader struct {
	rng *rand.ChaCha8
	n   int64
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.n {
		b = b[:p.n]
	}
	_, _ = p.rng.Read(b)
	p.n -= int64(len(b))
	return len(b), nil
}

func newPattern(n int64) *patternReader {
	return &patternReader{rng: rand.NewChaCha8([32]byte{1, 2, 3}), n: n}
}

func TestUploadDownloadLargeStreamed(t *testing.T) {
	const size = 256 << 20
	a := startAgent(t)
	ctx := testCtx(t)

	wantHash := sha256.New()
	if _, err := io.Copy(wantHash, newPattern(size)); err != nil {
		t.Fatal(err)
	}
	want := wantHash.Sum(nil)

	base := liveHeap()
	var peak uint64
	sample := func() {
		if h := liveHeap(); h > peak {
			peak = h
		}
	}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				sample()
			}
		}
	}()

	e, err := a.c.Upload(ctx, "big/data.bin", 0o600, "", newPattern(size))
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != filepath.Join(a.home, "big/data.bin") || e.Size != size || e.Type != "file" || e.Mode.Perm() != 0o600 {
		t.Fatalf("entry %+v", e)
	}
	body, n, err := a.c.Download(ctx, e.Path, "")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	got, err := io.Copy(h, body)
	body.Close()
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	if n != size || got != size || !bytes.Equal(h.Sum(nil), want) {
		t.Fatalf("download: content-length %d, read %d, hash match %v", n, got, bytes.Equal(h.Sum(nil), want))
	}
	growth := int64(peak) - int64(base)
	t.Logf("live heap growth peak %d KiB for %d MiB each way", growth>>10, size>>20)
	if growth > 32<<20 {
		t.Fatalf("live heap grew by %d MiB", growth>>20)
	}
	// No temporary file is left next to the target.
	ents, _ := os.ReadDir(filepath.Join(a.home, "big"))
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries", len(ents))
	}
}

func TestFilesHTTPWire(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	do := func(method, path string, q url.Values, ctype string, body io.Reader) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, a.url+path+"?"+q.Encode(), body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Access-Token", testToken)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	type entry struct{ Name, Type, Path string }

	t.Run("multipart paths from filenames", func(t *testing.T) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for _, f := range []struct{ path, data string }{
			{filepath.Join(a.home, "mp/one.txt"), "first"},
			{"mp/deeper/two.txt", "second"}, // relative to home
		} {
			w, err := mw.CreateFormFile("file", f.path)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(w, f.data)
		}
		mw.Close()
		resp, b := do("POST", "/files", url.Values{}, mw.FormDataContentType(), &buf)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var got []entry
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		want := []entry{
			{"one.txt", "file", filepath.Join(a.home, "mp/one.txt")},
			{"two.txt", "file", filepath.Join(a.home, "mp/deeper/two.txt")},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("response (-want +got):\n%s", diff)
		}
		for _, w := range []struct{ p, d string }{{want[0].Path, "first"}, {want[1].Path, "second"}} {
			if b, _ := os.ReadFile(w.p); string(b) != w.d {
				t.Errorf("%s = %q", w.p, b)
			}
		}
	})

	t.Run("multipart with query path and mode", func(t *testing.T) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		w, _ := mw.CreateFormFile("file", "ignored-name")
		io.WriteString(w, "#!/bin/sh\necho hi\n")
		mw.Close()
		target := filepath.Join(a.home, "bin/script.sh")
		resp, b := do("POST", "/files", url.Values{"path": {target}, "mode": {"0755"}}, mw.FormDataContentType(), &buf)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		fi, err := os.Stat(target)
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Fatalf("stat: %v %v", fi, err)
		}
		r := run(t, a.c, agent.ExecRequest{Argv: []string{target}})
		if r.stdout != "hi\n" {
			t.Fatalf("uploaded script printed %q", r.stdout)
		}
	})

	t.Run("octet-stream keeps existing mode", func(t *testing.T) {
		target := filepath.Join(a.home, "keep.txt")
		mustWrite(t, target, "old")
		os.Chmod(target, 0o640)
		resp, b := do("POST", "/files", url.Values{"path": {target}}, "application/octet-stream", strings.NewReader("new"))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		fi, _ := os.Stat(target)
		data, _ := os.ReadFile(target)
		if string(data) != "new" || fi.Mode().Perm() != 0o640 {
			t.Fatalf("content %q mode %v", data, fi.Mode())
		}
	})

	t.Run("upload through a symlink writes its target", func(t *testing.T) {
		real := filepath.Join(a.home, "real.txt")
		link := filepath.Join(a.home, "link.txt")
		mustWrite(t, real, "x")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		resp, b := do("POST", "/files", url.Values{"path": {link}}, "application/octet-stream", strings.NewReader("via link"))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if fi, _ := os.Lstat(link); fi.Mode()&fs.ModeSymlink == 0 {
			t.Fatal("symlink replaced")
		}
		if data, _ := os.ReadFile(real); string(data) != "via link" {
			t.Fatalf("target holds %q", data)
		}
	})

	errCases := []struct {
		name   string
		method string
		q      url.Values
		ctype  string
		body   string
		status int
	}{
		{"get missing", "GET", url.Values{"path": {"/nonexistent/file"}}, "", "", 404},
		{"get directory", "GET", url.Values{"path": {a.home}}, "", "", 400},
		{"get no path", "GET", url.Values{}, "", "", 400},
		{"get unknown user", "GET", url.Values{"path": {"x"}, "username": {"mallory"}}, "", "", 400},
		{"post no path", "POST", url.Values{}, "application/octet-stream", "x", 400},
		{"post onto directory", "POST", url.Values{"path": {a.home}}, "application/octet-stream", "x", 400},
		{"post bad mode", "POST", url.Values{"path": {"m.txt"}, "mode": {"999"}}, "application/octet-stream", "x", 400},
		{"post multipart without file part", "POST", url.Values{"path": {"m.txt"}}, "multipart/form-data; boundary=XX",
			"--XX\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nv\r\n--XX--\r\n", 400},
		{"delete", "DELETE", url.Values{"path": {"x"}}, "", "", 405},
	}
	for _, tc := range errCases {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(tc.method, "/files", tc.q, tc.ctype, strings.NewReader(tc.body))
			var je struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if resp.StatusCode != tc.status || json.Unmarshal(b, &je) != nil || je.Code != tc.status || je.Message == "" {
				t.Fatalf("status %d body %s, want %d with JSON {code,message}", resp.StatusCode, b, tc.status)
			}
		})
	}

	t.Run("get empty file", func(t *testing.T) {
		mustWrite(t, filepath.Join(a.home, "empty"), "")
		resp, b := do("GET", "/files", url.Values{"path": {"empty"}}, "", nil)
		if resp.StatusCode != 200 || len(b) != 0 || resp.Header.Get("Content-Length") != "0" {
			t.Fatalf("status %d len %d content-length %q", resp.StatusCode, len(b), resp.Header.Get("Content-Length"))
		}
	})
	t.Run("get synthetic file of unknown size", func(t *testing.T) {
		resp, b := do("GET", "/files", url.Values{"path": {"/proc/self/status"}}, "", nil)
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte("Pid:")) {
			t.Fatalf("status %d body %q", resp.StatusCode, b)
		}
	})
	t.Run("download errors are classified", func(t *testing.T) {
		if _, _, err := a.c.Download(ctx, "/nonexistent", ""); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("missing: %v", err)
		}
		if _, _, err := a.c.Download(ctx, "/", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("directory: %v", err)
		}
	})
}

func TestFilesystemOps(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	root := filepath.Join(a.home, "fs")

	d, err := a.c.MakeDir(ctx, "fs/a/b")
	if err != nil {
		t.Fatal(err)
	}
	if d.Type != "dir" || d.Path != filepath.Join(root, "a/b") || !d.Mode.IsDir() || d.Name != "b" {
		t.Fatalf("mkdir entry %+v", d)
	}
	if _, err := a.c.MakeDir(ctx, "fs/a/b"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("mkdir again: %v", err)
	}
	before := time.Now().Add(-time.Second)
	f, err := a.c.Upload(ctx, filepath.Join(root, "a/file.txt"), 0, "", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Size != 5 || f.Type != "file" || f.Mode != 0o644 || f.ModifiedAt.Before(before) {
		t.Fatalf("upload entry %+v", f)
	}
	if _, err := a.c.MakeDir(ctx, filepath.Join(root, "a/file.txt")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("mkdir over a file: %v", err)
	}
	if err := os.Symlink("file.txt", filepath.Join(root, "a/link")); err != nil {
		t.Fatal(err)
	}
	l, err := a.c.Stat(ctx, filepath.Join(root, "a/link"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Type != "symlink" || l.SymlinkTarget != "file.txt" || l.Mode&fs.ModeSymlink == 0 {
		t.Fatalf("symlink entry %+v", l)
	}
	if _, err := a.c.Stat(ctx, filepath.Join(root, "nope")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat missing: %v", err)
	}

	names := func(es []agent.Entry) []string {
		var out []string
		for _, e := range es {
			rel, _ := filepath.Rel(root, e.Path)
			out = append(out, rel+":"+e.Type)
		}
		sort.Strings(out)
		return out
	}
	tests := []struct {
		depth int
		want  []string
	}{
		{0, []string{"a:dir"}},
		{1, []string{"a:dir"}},
		{2, []string{"a/b:dir", "a/file.txt:file", "a/link:symlink", "a:dir"}},
		{5, []string{"a/b:dir", "a/file.txt:file", "a/link:symlink", "a:dir"}},
	}
	for _, tc := range tests {
		es, err := a.c.ListDir(ctx, root, tc.depth)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, names(es)); diff != "" {
			t.Errorf("list depth %d (-want +got):\n%s", tc.depth, diff)
		}
	}
	if _, err := a.c.ListDir(ctx, filepath.Join(root, "a/file.txt"), 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("list a file: %v", err)
	}
	if _, err := a.c.ListDir(ctx, filepath.Join(root, "missing"), 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("list missing: %v", err)
	}

	m, err := a.c.Move(ctx, filepath.Join(root, "a/file.txt"), filepath.Join(root, "moved/deep/f.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Path != filepath.Join(root, "moved/deep/f.txt") || m.Size != 5 || m.Type != "file" {
		t.Fatalf("move entry %+v", m)
	}
	if _, err := os.Stat(filepath.Join(root, "a/file.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("source still there: %v", err)
	}
	if _, err := a.c.Move(ctx, filepath.Join(root, "nope"), filepath.Join(root, "x")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("move missing: %v", err)
	}

	if err := a.c.Remove(ctx, filepath.Join(root, "moved"), false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("non-recursive remove of non-empty dir: %v", err)
	}
	if err := a.c.Remove(ctx, filepath.Join(root, "nope"), false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("non-recursive remove of missing: %v", err)
	}
	if err := a.c.Remove(ctx, filepath.Join(root, "a/b"), false); err != nil {
		t.Fatalf("non-recursive remove of empty dir: %v", err)
	}
	if err := a.c.Remove(ctx, filepath.Join(root, "moved"), true); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Remove(ctx, filepath.Join(root, "moved"), true); err != nil {
		t.Fatalf("recursive remove is idempotent: %v", err)
	}
	es, err := a.c.ListDir(ctx, root, 3)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a/link:symlink", "a:dir"}, names(es)); diff != "" {
		t.Errorf("final tree (-want +got):\n%s", diff)
	}
}

// TestNonUTF8Names: a directory holding names that are not UTF-8 lists (the protocol's strings
// must be UTF-8, so the invalid bytes show as U+FFFD), and so does a link to such a name.
func TestNonUTF8Names(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	root := filepath.Join(a.home, "names")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"ok.txt", "bad\xff.txt", "\xc3"} {
		if err := os.WriteFile(filepath.Join(root, n), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("to\xfe", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	es, err := a.c.ListDir(ctx, root, 1)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	got := map[string]string{}
	for _, e := range es {
		got[e.Name] = e.SymlinkTarget
		if e.Path != filepath.Join(root, e.Name) {
			t.Errorf("entry %q has path %q", e.Name, e.Path)
		}
	}
	want := map[string]string{"ok.txt": "", "bad\uFFFD.txt": "", "\uFFFD": "", "link": "to\uFFFD"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

func TestWatch(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	dir := filepath.Join(a.home, "watched")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := a.c.Watch(ctx, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	events := make(chan agent.FSEvent, 100)
	go func() {
		defer close(events)
		for {
			ev, err := w.Recv()
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	expect := func(want ...agent.FSEvent) {
		t.Helper()
		pending := slices.Clone(want)
		var seen []agent.FSEvent
		timeout := time.After(5 * time.Second)
		for len(pending) > 0 {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("watch ended; seen %v, pending %v", seen, pending)
				}
				seen = append(seen, ev)
				if i := slices.Index(pending, ev); i >= 0 {
					pending = slices.Delete(pending, i, i+1)
				}
			case <-timeout:
				t.Fatalf("missing events %v; seen %v", pending, seen)
			}
		}
	}

	mustWrite(t, filepath.Join(dir, "f.txt"), "data")
	expect(agent.FSEvent{Name: "f.txt", Op: "create"}, agent.FSEvent{Name: "f.txt", Op: "write"})
	os.Chmod(filepath.Join(dir, "f.txt"), 0o600)
	expect(agent.FSEvent{Name: "f.txt", Op: "chmod"})
	os.Rename(filepath.Join(dir, "f.txt"), filepath.Join(dir, "g.txt"))
	expect(agent.FSEvent{Name: "f.txt", Op: "rename"}, agent.FSEvent{Name: "g.txt", Op: "create"})
	os.Remove(filepath.Join(dir, "g.txt"))
	expect(agent.FSEvent{Name: "g.txt", Op: "remove"})

	// A subdirectory created after the watch started is watched too.
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	expect(agent.FSEvent{Name: "sub", Op: "create"})
	mustWrite(t, filepath.Join(dir, "sub/inner.txt"), "x")
	expect(agent.FSEvent{Name: "sub/inner.txt", Op: "create"})
	// A tree created in one go is reported even if it appeared before its watch was added.
	os.MkdirAll(filepath.Join(dir, "x/y/z"), 0o755)
	expect(agent.FSEvent{Name: "x", Op: "create"}, agent.FSEvent{Name: "x/y", Op: "create"}, agent.FSEvent{Name: "x/y/z", Op: "create"})

	if _, err := a.c.Watch(ctx, filepath.Join(a.home, "missing"), false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("watch missing dir: %v", err)
	}

	// Removing the watched directory ends the stream.
	os.RemoveAll(dir)
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch did not end after its directory was removed")
		}
	}
}

func TestNonRecursiveWatchIgnoresSubdirs(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	w, err := a.c.Watch(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mustWrite(t, filepath.Join(dir, "sub/hidden.txt"), "x")
	mustWrite(t, filepath.Join(dir, "top.txt"), "x")
	ev, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ev != (agent.FSEvent{Name: "top.txt", Op: "create"}) {
		t.Fatalf("first event %+v, want create top.txt", ev)
	}
}
