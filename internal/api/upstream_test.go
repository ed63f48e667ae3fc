package api_test

import (
	"net/http"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// notUTF8Entries is a ListDirResponse (and a StatResponse: field 1 either way) whose entry's name
// is not UTF-8, which a protobuf string must be: what a sandbox's own server could send in the
// agent's place (the real agent replaces such bytes with U+FFFD).
func notUTF8Entries() []byte {
	var entry, msg []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendBytes(entry, []byte("a\xffb"))
	msg = protowire.AppendTag(msg, 1, protowire.BytesType)
	return protowire.AppendBytes(msg, entry)
}

// TestAgentAnswerNotUTF8Is502: an agent answer spaced cannot read is the upstream's failure:
// 502 bad_gateway with the JSON error, not 400 (the client asked nothing wrong) or 500.
func TestAgentAnswerNotUTF8Is502(t *testing.T) {
	e := newEnv(t)
	e.drv.Agent = func(agent http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/filesystem.Filesystem/ListDir", "/filesystem.Filesystem/Stat", "/filesystem.Filesystem/MakeDir":
				w.Header().Set("Content-Type", "application/proto")
				w.Write(notUTF8Entries())
			default:
				agent.ServeHTTP(w, r)
			}
		})
	}
	id := e.create("")
	dir := t.TempDir()
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/" + id + "/fs?path=" + dir, ""},
		{"POST", "/v1/sandboxes/" + id + "/fs/mkdir", `{"path":"` + dir + `/d"}`},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			wantError(t, e.do(c.method, c.path, c.body), 502, "bad_gateway")
		})
	}
	// The rest of the agent works: the sandbox is fine, only the answer was bad.
	if x := e.exec(id, `{"cmd":["true"]}`); x.ExitCode != 0 {
		t.Fatalf("exec after the bad answers: %+v", x)
	}
}
