package api_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestE2BJSONDepth: the E2B routes refuse a body nested past 32 levels before decoding it, as
// the native API does (E2B's decoder ignores unknown fields, so depth hides in one), with E2B's
// JSON error, and create nothing; 32 levels are still accepted.
func TestE2BJSONDepth(t *testing.T) {
	e := newEnv(t)
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	count := func() int {
		var list struct{ Sandboxes []struct{ ID string } }
		e.do("GET", "/v1/sandboxes", "").json(t, &list)
		return len(list.Sandboxes)
	}
	for _, c := range []struct {
		name, body string
		status     int
	}{
		{"too deep", `{"templateID":"minimal","x":` + nest(32) + `}`, 400},
		{"far too deep", `{"templateID":"minimal","x":` + nest(100000) + `}`, 400},
		{"too large", `{"templateID":"minimal","x":"` + strings.Repeat("a", 1<<20) + `"}`, 413},
		{"at the limit", `{"templateID":"minimal","timeout":60,"x":` + nest(31) + `}`, 201},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := count()
			r := e.doKey("", "POST", "/sandboxes", c.body, "X-API-Key", e.key)
			if r.status != c.status {
				t.Fatalf("status %d (%.300s), want %d", r.status, r.body, c.status)
			}
			if c.status == 201 {
				return
			}
			var body struct {
				Code    int
				Message string
			}
			if err := json.Unmarshal(r.body, &body); err != nil || body.Code != c.status || body.Message == "" {
				t.Fatalf("body %.300s, want E2B's JSON error with code %d", r.body, c.status)
			}
			if after := count(); after != before {
				t.Fatalf("a refused body created a sandbox: %d → %d", before, after)
			}
		})
	}
	// Every route that decodes a body refuses it the same way.
	id := e.create("")
	for _, p := range []string{"/sandboxes/" + id + "/timeout", "/sandboxes/" + id + "/connect", "/sandboxes/" + id + "/network", "/sandboxes/" + id + "/snapshots", "/sandboxes/" + id + "/fork"} {
		method := "POST"
		if strings.HasSuffix(p, "/network") {
			method = "PUT"
		}
		if r := e.doKey("", method, p, `{"x":`+nest(40)+`}`, "X-API-Key", e.key); r.status != 400 {
			t.Errorf("%s %s: status %d (%.200s), want 400", method, p, r.status, r.body)
		}
	}
}
