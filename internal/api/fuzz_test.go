package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/space-sandbox/space/internal/jsondepth"
)

// FuzzDecodeCreate: the strict decoder never panics, and what it accepts re-encodes to JSON that
// it accepts again with the same meaning.
func FuzzDecodeCreate(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"template":"minimal","timeout_seconds":60}`, `{"env":{"A":"b"},"metadata":{"k":"v"}}`,
		`{"resources":{"vcpus":2,"memory_mib":1024}}`, `{"network":{"egress":{"default":"deny","allow":["a.com"]}}}`,
		`{"templat":"x"}`, `{"timeout_seconds":"x"}`, `{} {}`, `[]`, `null`, `{"env":null}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req createRequest
		if err := decodeJSONFrom(strings.NewReader(body), &req); err != nil {
			if _, code := statusOf(err); code != "invalid_argument" {
				t.Fatalf("decode error mapped to %s: %v", code, err)
			}
			return
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var req2 createRequest
		if err := decodeJSONFrom(bytes.NewReader(again), &req2); err != nil {
			t.Fatalf("re-decode of %s: %v", again, err)
		}
		if b, _ := json.Marshal(req2); !bytes.Equal(b, again) {
			t.Fatalf("round trip changed %s to %s", again, b)
		}
	})
}

// FuzzExecRequest: any body either fails as invalid_argument or yields a runnable command.
func FuzzExecRequest(f *testing.F) {
	for _, s := range []string{
		`{"cmd":["echo","hi"]}`, `{"command":"ls"}`, `{"cmd":["a"],"command":"b"}`, `{"cmd":[]}`,
		`{"command":"x","cwd":"rel"}`, `{"command":"x","timeout_seconds":-1}`, `{"command":"x","pty":{"cols":0,"rows":1}}`,
		`{"command":"x","user":"a:b"}`, `{"cmd":["a\u0000b"]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req execRequest
		if err := decodeJSONFrom(strings.NewReader(body), &req); err != nil {
			return
		}
		o, err := req.options()
		if err != nil {
			if _, code := statusOf(err); code != "invalid_argument" {
				t.Fatalf("options error mapped to %s: %v", code, err)
			}
			return
		}
		if len(o.Argv) == 0 || o.Argv[0] == "" {
			t.Fatalf("accepted an empty command: %s", body)
		}
		if o.Cwd != "" && (!strings.HasPrefix(o.Cwd, "/") || path.Clean(o.Cwd) != o.Cwd) {
			t.Fatalf("accepted cwd %q", o.Cwd)
		}
		if o.Timeout < 0 || (o.PTY != nil && (o.PTY.Cols == 0 || o.PTY.Rows == 0)) {
			t.Fatalf("accepted %+v", o)
		}
	})
}

// FuzzCleanPath: accepted paths are absolute, clean, valid UTF-8, NUL-free and bounded.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "a", "", "/../../etc/passwd", "/a/./b//c/", "/a\x00b", "/a\xffb", strings.Repeat("/x", 3000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := cleanPath("path", p)
		if err != nil {
			if _, code := statusOf(err); code != "invalid_argument" {
				t.Fatalf("mapped to %s", code)
			}
			return
		}
		if !strings.HasPrefix(got, "/") || path.Clean(got) != got || strings.ContainsRune(got, 0) || len(got) > maxPath || !utf8.ValidString(got) {
			t.Fatalf("cleanPath(%q) = %q", p, got)
		}
		for _, part := range strings.Split(got, "/") {
			if part == ".." {
				t.Fatalf("cleanPath(%q) = %q keeps ..", p, got)
			}
		}
	})
}

// FuzzUTF8Splitter: chunks pass through whole (nothing lost, nothing added), and a valid UTF-8
// stream is never cut inside a character, however it is split.
func FuzzUTF8Splitter(f *testing.F) {
	f.Add([]byte("héllo wörld ✓"), uint8(3))
	f.Add([]byte{0xff, 0xfe, 'a'}, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		n := int(step%16) + 1
		var u utf8Splitter
		var out []byte
		for i := 0; i < len(data); i += n {
			chunk := u.next(data[i:min(i+n, len(data))])
			if utf8.Valid(data) && !utf8.Valid(chunk) {
				t.Fatalf("valid input split mid-character: %q", chunk)
			}
			out = append(out, chunk...)
		}
		out = append(out, u.flush()...)
		if !bytes.Equal(out, data) {
			t.Fatalf("got %q, want %q", out, data)
		}
	})
}

// FuzzJSONStringWriter: the streaming JSON string writer agrees with encoding/json.
func FuzzJSONStringWriter(f *testing.F) {
	f.Add([]byte("plain"))
	f.Add([]byte("quote\" backslash\\ newline\n tab\t <tag> & \u2028 \x01 \xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := os.CreateTemp(t.TempDir(), "spool")
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		file.Write(data)
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		if err := writeJSONStringFrom(w, file); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
			t.Fatalf("invalid JSON %q: %v", buf.Bytes(), err)
		}
		want, _ := json.Marshal(string(data))
		var wantS string
		json.Unmarshal(want, &wantS)
		if got != wantS {
			t.Fatalf("got %q, want %q", got, wantS)
		}
	})
}

// FuzzJSONDepth: for valid JSON, jsondepth.Of is the nesting the decoder's tokens show.
func FuzzJSONDepth(f *testing.F) {
	for _, s := range []string{`{}`, `[[[]]]`, `{"a":"[[[{{"}`, `{"a\"[":[1,{"b":[]}]}`, `"\\"`, `[{"x":"\\\"]"}]`, strings.Repeat("[", 40) + strings.Repeat("]", 40)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			jsondepth.Of(b) // must not panic
			return
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		depth, most := 0, 0
		for {
			tok, err := dec.Token()
			if err != nil {
				break
			}
			switch tok {
			case json.Delim('['), json.Delim('{'):
				depth++
				most = max(most, depth)
			case json.Delim(']'), json.Delim('}'):
				depth--
			}
		}
		if got := jsondepth.Of(b); got != most {
			t.Fatalf("jsondepth.Of(%q) = %d, want %d", b, got, most)
		}
	})
}

// TestJSONDepthLimit: a body nested past maxJSONDepth is refused before decoding, whatever
// the target; one at the limit decodes.
func TestJSONDepthLimit(t *testing.T) {
	nest := func(n int) string { return `{"a":` + strings.Repeat("[", n-1) + strings.Repeat("]", n-1) + `}` }
	var v map[string]any
	if err := decodeJSONFrom(strings.NewReader(nest(maxJSONDepth)), &v); err != nil {
		t.Fatalf("depth %d: %v", maxJSONDepth, err)
	}
	err := decodeJSONFrom(strings.NewReader(nest(maxJSONDepth+1)), &v)
	if _, code := statusOf(err); code != "invalid_argument" || !strings.Contains(err.Error(), "nested more than") {
		t.Fatalf("depth %d: %v", maxJSONDepth+1, err)
	}
	// Brackets inside strings do not count.
	if err := decodeJSONFrom(strings.NewReader(`{"a":"`+strings.Repeat("[", 100)+`\"{"}`), &v); err != nil {
		t.Fatalf("brackets in a string: %v", err)
	}
}

func TestRedactHostPaths(t *testing.T) {
	for in, want := range map[string]string{
		"runsc restore: open /var/lib/space/runtime/gvisor/sandboxes/sbx_1/upper: no such file": "runsc restore: open <path>: no such file",
		`restore from snap_1 failed: "/tmp/x/y" (deleted)`:                                      `restore from snap_1 failed: "<path>" (deleted)`,
		"sandbox runtime died":               "sandbox runtime died",
		"exit status 1 at /":                 "exit status 1 at /",
		"http://10.0.0.1:49983/x":            "http://10.0.0.1:49983/x",
		"see /run/space/net/a and /root/b/c": "see <path> and <path>",
	} {
		if got := redactHostPaths(in); got != want {
			t.Errorf("redactHostPaths(%q) = %q, want %q", in, got, want)
		}
	}
}
