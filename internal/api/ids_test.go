package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/secrets"
	"github.com/space-sandbox/space/internal/template"
)

// malformedIDs are IDs of shapes no sandbox, snapshot, key, secret or template has. IDs are
// opaque (API.md), so each one names nothing: 404 with the JSON error, like an unknown ID.
// "." and ".." are not here: the router cleans them out of the path (a redirect) before any
// route sees them.
var malformedIDs = []string{
	"nope", "sbx_", "sbx_" + strings.Repeat("a", 19), "sbx_" + strings.Repeat("a", 21),
	"SBX_" + strings.Repeat("A", 20), "sbx-" + strings.Repeat("a", 20), "snp_" + strings.Repeat("a", 20),
	"sbx_" + strings.Repeat("a", 19) + "-", "key_0", "x",
	"a/b", "\x00", "sbx_" + strings.Repeat("a", 19) + "\x00", "\xff\xfe", "é", " ", "%", "a?b", "a#b",
	"<script>", `'; DROP TABLE sandboxes; --`, `"quoted"`, "sbx_" + strings.Repeat("a", 20) + "\n",
	strings.Repeat("a", 8<<10), "sbx_" + strings.Repeat("a", 100<<10),
}

// wireSafe reports whether id can travel in a header or a host name as it is.
var wireSafe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,60}$`).MatchString

// TestMalformedIDsAre404 calls every route that names something by ID (the tenancy table's
// routes with a path ID, and the envd and port routes) with each malformed ID in turn, as the
// admin, which may do anything: every answer is 404 with the JSON error, never 400 or 5xx, and
// nothing changes.
func TestMalformedIDsAre404(t *testing.T) {
	box, err := secrets.New(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := cas.Open(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	templates, err := template.New(template.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	e := newEnvWith(t, services{templates: templates, secrets: box}, func(c *sandbox.Config) {
		c.Chunks, c.StateDir = chunks, stateDir
	})
	url0 := newTenancyServer(e)
	owned := e.create(`{"timeout_seconds":600}`)
	if r := e.do("PUT", "/v1/secrets/kept", `{"value":"v","hosts":["x.example"]}`); r.status != 204 {
		t.Fatalf("put secret: %d %s", r.status, r.body)
	}
	state := func() string {
		var out strings.Builder
		for _, p := range []string{"/v1/sandboxes", "/v1/snapshots", "/v1/secrets", "/v1/keys", "/v1/templates", "/v1/sandboxes/" + owned + "/processes"} {
			r := e.do("GET", p, "")
			fmt.Fprintf(&out, "%s %d %s\n", p, r.status, r.body)
		}
		fmt.Fprintf(&out, "driver: %v\n", mustList(e.drv))
		return out.String()
	}
	before := state()

	var routes []string
	for r := range tenancyRoutes {
		switch {
		case r == "PUT /v1/secrets/{name}":
			continue // creates the name it is given: a bad one is 400, as any bad field
		case strings.HasPrefix(r, "ENVD ") || strings.HasPrefix(r, "PORT ") || strings.Contains(r, "{"):
			routes = append(routes, r)
		}
	}
	sort.Strings(routes)
	if len(routes) < 50 {
		t.Fatalf("only %d ID-bearing routes found in the tenancy table: %v", len(routes), routes)
	}
	for _, route := range routes {
		byHost := strings.HasPrefix(route, "ENVD ") || strings.HasPrefix(route, "PORT ")
		for i, id := range malformedIDs {
			if byHost && !wireSafe(id) {
				continue // cannot be sent in a header or host name at all
			}
			t.Run(fmt.Sprintf("%s/%d", route, i), func(t *testing.T) {
				esc := url.PathEscape(id)
				if byHost {
					esc = id
				}
				v := tenancyVictim{sandbox: esc, snapshot: esc, keyID: esc, secret: esc, pid: 1, canary: t.TempDir()}
				c, call := tenancyRoutes[route], route
				if strings.HasPrefix(route, "DELETE /v1/templates/") {
					call = strings.Replace(route, "{name}", esc, 1) // tenancyVictim.path names the real "minimal" there
				}
				status, body := tenancyRequest(t, url0, v, call, c, e.key)
				if status != 404 {
					t.Fatalf("ID %.40q: status %d (%.300s), want 404", id, status, body)
				}
				var native struct {
					Error struct{ Code, Message string }
				}
				var e2b struct {
					Code    int
					Message string
				}
				if json.Unmarshal(body, &native) == nil && native.Error.Code == "not_found" && native.Error.Message != "" {
					return
				}
				if json.Unmarshal(body, &e2b) == nil && e2b.Code == 404 && e2b.Message != "" {
					return
				}
				t.Fatalf("ID %.40q: body %.300s, want the JSON not-found error", id, body)
			})
		}
	}
	if after := state(); after != before {
		t.Fatalf("malformed IDs changed state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
