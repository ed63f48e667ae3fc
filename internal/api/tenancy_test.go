package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/secrets"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/template"
)

// tenancyCase says how to call one route as an attacker: with a body and query that would be
// valid for the owner, so that only authorisation can refuse it.
type tenancyCase struct {
	query, body string
	header      []string
	// own marks routes that name nothing of another tenant's (lists, creates, a tenant's own
	// secret namespace): another tenant's key may succeed there, on its own tenant only, and
	// must see nothing of the victim's.
	own bool
}

// tenancyRoutes covers every route the native API and the E2B control plane register.
// TestTenancyRouteTable fails if a registered route is missing here, so a new route cannot
// skip the walk. Path parameters are filled with the victim's resources (see tenancyPath).
var tenancyRoutes = map[string]tenancyCase{
	"GET /healthz":   {own: true}, // unauthenticated by design
	"GET /metrics":   {own: true}, // unauthenticated by design; TestMetricsLabelsBounded
	"GET /v1/info":   {own: true},
	"POST /v1/keys":  {body: `{"tenant":"victim"}`, own: true},
	"GET /v1/keys":   {own: true},
	"GET /v1/events": {own: true},

	"DELETE /v1/keys/{id}": {},

	"POST /v1/sandboxes":                                        {body: `{"from_snapshot":"$SNAP"}`},
	"GET /v1/sandboxes":                                         {own: true},
	"GET /v1/sandboxes/{id}":                                    {},
	"DELETE /v1/sandboxes/{id}":                                 {},
	"POST /v1/sandboxes/{id}/timeout":                           {body: `{"timeout_seconds":5}`},
	"POST /v1/sandboxes/{id}/pause":                             {},
	"POST /v1/sandboxes/{id}/resume":                            {},
	"POST /v1/sandboxes/{id}/fork":                              {body: `{"count":1}`},
	"PATCH /v1/sandboxes/{id}/network":                          {body: `{"egress":{"default":"allow"}}`},
	"GET /v1/sandboxes/{id}/egress":                             {},
	"GET /v1/sandboxes/{id}/ports/{port}/{path...}":             {},
	"POST /v1/sandboxes/{id}/ports/{port}/{path...}":            {body: `x`},
	"PUT /v1/sandboxes/{id}/ports/{port}/{path...}":             {body: `x`},
	"PATCH /v1/sandboxes/{id}/ports/{port}/{path...}":           {body: `x`},
	"DELETE /v1/sandboxes/{id}/ports/{port}/{path...}":          {},
	"POST /v1/sandboxes/{id}/snapshots":                         {body: `{"kind":"filesystem"}`},
	"GET /v1/sandboxes/{id}/snapshots":                          {},
	"POST /v1/sandboxes/{id}/restore":                           {body: `{"snapshot_id":"$SNAP"}`},
	"GET /v1/sandboxes/{id}/lineage":                            {},
	"GET /v1/snapshots":                                         {own: true},
	"GET /v1/snapshots/{sid}":                                   {},
	"DELETE /v1/snapshots/{sid}":                                {},
	"GET /v1/snapshots/{sid}/diff":                              {query: "against=$SNAP"},
	"POST /v1/sandboxes/{id}/exec":                              {body: `{"command":"touch $CANARY/exec"}`},
	"GET /v1/sandboxes/{id}/processes":                          {},
	"POST /v1/sandboxes/{id}/code":                              {body: `{"code":"open('/tmp/pwned','w')"}`},
	"GET /v1/sandboxes/{id}/code/contexts":                      {},
	"POST /v1/sandboxes/{id}/code/contexts":                     {body: `{"language":"python"}`},
	"DELETE /v1/sandboxes/{id}/code/contexts/{ctx}":             {},
	"POST /v1/sandboxes/{id}/code/contexts/{ctx}/restart":       {},
	"GET /v1/sandboxes/{id}/processes/{pid}/events":             {},
	"POST /v1/sandboxes/{id}/processes/{pid}/stdin":             {body: `x`},
	"POST /v1/sandboxes/{id}/processes/{pid}/signal":            {body: `{"signal":"SIGKILL"}`},
	"POST /v1/sandboxes/{id}/processes/{pid}/resize":            {body: `{"cols":10,"rows":10}`},
	"PUT /v1/sandboxes/{id}/files":                              {query: "path=$CANARY/up", body: `x`},
	"GET /v1/sandboxes/{id}/files":                              {query: "path=$CANARY/canary"},
	"DELETE /v1/sandboxes/{id}/files":                           {query: "path=$CANARY/canary"},
	"GET /v1/sandboxes/{id}/fs":                                 {query: "path=$CANARY"},
	"POST /v1/sandboxes/{id}/fs/mkdir":                          {body: `{"path":"$CANARY/d"}`},
	"POST /v1/sandboxes/{id}/fs/move":                           {body: `{"from":"$CANARY/canary","to":"$CANARY/moved"}`},
	"GET /v1/sandboxes/{id}/fs/watch":                           {query: "path=$CANARY"},
	"PUT /v1/secrets/{name}":                                    {body: `{"value":"v","hosts":["x.example"]}`, own: true},
	"GET /v1/secrets":                                           {own: true},
	"DELETE /v1/secrets/{name}":                                 {},
	"GET /v1/templates":                                         {own: true},
	"POST /v1/templates":                                        {body: `{"name":"t2","from":{"template":"minimal"}}`},
	"DELETE /v1/templates/{name}":                               {},
	"POST /sandboxes":                                           {body: `{"templateID":"$SNAP"}`},
	"POST /v2/sandboxes":                                        {body: `{"templateID":"$SNAP"}`},
	"GET /sandboxes":                                            {own: true},
	"GET /v2/sandboxes":                                         {own: true},
	"GET /sandboxes/{id}":                                       {},
	"DELETE /sandboxes/{id}":                                    {},
	"POST /sandboxes/{id}/timeout":                              {body: `{"timeout":5}`},
	"POST /sandboxes/{id}/pause":                                {},
	"POST /sandboxes/{id}/resume":                               {body: `{"timeout":5}`},
	"POST /sandboxes/{id}/connect":                              {body: `{"timeout":5}`},
	"POST /v2/sandboxes/{id}/connect":                           {body: `{"timeout":5}`},
	"GET /sandboxes/{id}/metrics":                               {},
	"PUT /sandboxes/{id}/network":                               {body: `{"allowOut":["example.com"]}`},
	"POST /sandboxes/{id}/snapshots":                            {body: `{}`},
	"GET /snapshots":                                            {own: true},
	"DELETE /templates/{id}":                                    {},
	"POST /sandboxes/{id}/fork":                                 {body: `{}`},
	"ENVD (E2b-Sandbox-Id) POST /process.Process/Start":         {body: `{}`, header: []string{"Content-Type", "application/json"}},
	"ENVD (E2b-Sandbox-Id) GET /files":                          {query: "path=$CANARY/canary"},
	"ENVD (49983-<id> host) POST /filesystem.Filesystem/Remove": {body: `{"path":"$CANARY/canary"}`, header: []string{"Content-Type", "application/json"}},
	"PORT (8080-<id> host) GET /":                               {},
}

// tenancyVictim is what one tenant owns while another tries to reach it.
type tenancyVictim struct {
	key, keyID         string
	sandbox, snapshot  string
	secret             string
	pid                uint32
	canary             string // a directory only the victim's sandbox writes (the fake shares the host's files)
	accessToken, token string // the sandbox's envd access token and traffic token
}

func (v tenancyVictim) expand(s string) string {
	return strings.NewReplacer("$SNAP", v.snapshot, "$CANARY", v.canary).Replace(s)
}

// tenancyPath fills a route's path parameters with the victim's resources.
func (v tenancyVictim) path(pattern string) string {
	id := v.sandbox
	switch {
	case strings.HasPrefix(pattern, "/v1/keys/"):
		id = v.keyID
	case strings.HasPrefix(pattern, "/templates/"):
		id = v.snapshot // E2B templates are snapshots
	}
	name := v.secret
	if strings.HasPrefix(pattern, "/v1/templates/") {
		name = "minimal"
	}
	return strings.NewReplacer("{id}", id, "{sid}", v.snapshot, "{name}", name,
		"{pid}", fmt.Sprint(v.pid), "{port}", "8080", "{path...}", "x", "{ctx}", "default").Replace(pattern)
}

// newTenancyServer serves e's manager again with a sandbox domain, for the host-name routes.
func newTenancyServer(e *env) string {
	srv := httptest.NewServer(api.New(api.Config{Sandboxes: e.mgr, Templates: e.tpl, Secrets: e.vault, Keys: e.keys, Version: "test",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Domain: "sbx.test"}))
	e.t.Cleanup(srv.Close)
	return srv.URL
}

// tenancyRequest sends one route's request with key as the credential ("" for none); it never
// waits more than 3 s (a stream that opened is read no further).
func tenancyRequest(t *testing.T, url string, v tenancyVictim, route string, c tenancyCase, key string) (int, []byte) {
	t.Helper()
	method, pattern, _ := strings.Cut(route, " ")
	host := ""
	var hdr []string
	switch {
	case strings.HasPrefix(route, "ENVD (E2b-Sandbox-Id) "):
		method, pattern, _ = strings.Cut(strings.TrimPrefix(route, "ENVD (E2b-Sandbox-Id) "), " ")
		hdr = append(hdr, "E2b-Sandbox-Id", v.sandbox)
	case strings.HasPrefix(route, "ENVD (49983-<id> host) "):
		method, pattern, _ = strings.Cut(strings.TrimPrefix(route, "ENVD (49983-<id> host) "), " ")
		host = "49983-" + v.sandbox + ".sbx.test"
	case strings.HasPrefix(route, "PORT (8080-<id> host) "):
		method, pattern, _ = strings.Cut(strings.TrimPrefix(route, "PORT (8080-<id> host) "), " ")
		host = "8080-" + v.sandbox + ".sbx.test"
	}
	target := url + v.path(pattern)
	if c.query != "" {
		target += "?" + v.expand(c.query)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, target, strings.NewReader(v.expand(c.body)))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-API-Key", key)
	}
	hdr = append(hdr, c.header...)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", route, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<16)) // a stream ends with ctx
	return res.StatusCode, b
}

// tenancyState is everything of the victim's an attacker's request could change.
func tenancyState(t *testing.T, e *env, v tenancyVictim) string {
	t.Helper()
	var out strings.Builder
	for _, get := range []struct{ key, path string }{
		{v.key, "/v1/sandboxes"}, {v.key, "/v1/snapshots"}, {v.key, "/v1/secrets"},
		{v.key, "/v1/sandboxes/" + v.sandbox + "/processes"}, {v.key, "/v1/sandboxes/" + v.sandbox + "/egress"},
		{e.key, "/v1/keys"}, {e.key, "/v1/templates"},
	} {
		r := e.doKey(get.key, "GET", get.path, "")
		fmt.Fprintf(&out, "%s %d %s\n", get.path, r.status, r.body)
	}
	entries, _ := os.ReadDir(v.canary)
	for _, de := range entries {
		b, _ := os.ReadFile(filepath.Join(v.canary, de.Name()))
		fmt.Fprintf(&out, "canary %s %q\n", de.Name(), b)
	}
	ids := mustList(e.drv)
	fmt.Fprintf(&out, "driver has victim sandbox: %v\n", slices.Contains(ids, v.sandbox))
	return out.String()
}

func TestTenancyRouteTable(t *testing.T) {
	native, e2b := api.RegisteredRoutes(t)
	registered := append(native, e2b...)
	if !slices.Contains(registered, "POST /v1/sandboxes") || !slices.Contains(registered, "POST /sandboxes") {
		t.Fatalf("the route parser found %v; is it still reading routes()?", registered)
	}
	for _, r := range registered {
		if _, ok := tenancyRoutes[r]; !ok {
			t.Errorf("route %s is registered but not in tenancyRoutes: add how an attacker calls it", r)
		}
	}
	for r := range tenancyRoutes {
		if !slices.Contains(registered, r) && !strings.HasPrefix(r, "ENVD ") && !strings.HasPrefix(r, "PORT ") {
			t.Errorf("tenancyRoutes lists %s, which is not registered", r)
		}
	}
}

// TestTenancyEveryRoute calls every route with another tenant's key, a revoked key and no key,
// against a victim tenant's sandbox, snapshot, secret, process and key, and checks the answer is
// 401/403/404 (another tenant's key may use routes that name nothing of the victim's, and sees
// nothing of it there) and that none of the victim's state changed.
func TestTenancyEveryRoute(t *testing.T) {
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
	url := newTenancyServer(e)
	ctx := context.Background()
	var v tenancyVictim
	v.keyID, v.key = e.newTenantKey("victim")
	_, mallory := e.newTenantKey("mallory")
	revokedID, revoked := e.newTenantKey("victim")
	if r := e.do("DELETE", "/v1/keys/"+revokedID, ""); r.status != 204 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	v.canary = t.TempDir()
	if err := os.WriteFile(filepath.Join(v.canary, "canary"), []byte("victim"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The victim's sandbox: through E2B, so that its ports need a traffic token.
	r := e.doKey("", "POST", "/sandboxes", `{"templateID":"minimal","timeout":600,"network":{"allowPublicTraffic":false}}`, "X-API-Key", v.key)
	if r.status != 201 {
		t.Fatalf("e2b create: %d %s", r.status, r.body)
	}
	var sb struct {
		SandboxID          string `json:"sandboxID"`
		EnvdAccessToken    string `json:"envdAccessToken"`
		TrafficAccessToken string `json:"trafficAccessToken"`
	}
	r.json(t, &sb)
	v.sandbox, v.accessToken, v.token = sb.SandboxID, sb.EnvdAccessToken, sb.TrafficAccessToken
	if v.token == "" {
		t.Fatalf("no traffic token in %s", r.body)
	}
	r = e.doKey(v.key, "POST", "/v1/sandboxes/"+v.sandbox+"/exec", `{"command":"sleep 600","background":true}`)
	if r.status != 202 {
		t.Fatalf("background: %d %s", r.status, r.body)
	}
	var bg struct{ PID uint32 }
	r.json(t, &bg)
	v.pid = bg.PID
	// The fake runtime cannot snapshot; the victim's snapshot is a record in the store.
	v.snapshot = "snp_" + strings.Repeat("v", 20)
	if err := e.st.CreateSnapshot(ctx, store.Snapshot{ID: v.snapshot, Tenant: "victim", SandboxID: v.sandbox,
		Kind: "filesystem", CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	v.secret = "victim-secret"
	if r := e.doKey(v.key, "PUT", "/v1/secrets/"+v.secret, `{"value":"s3cr3t","hosts":["api.example"]}`); r.status != 204 {
		t.Fatalf("put secret: %d %s", r.status, r.body)
	}
	// The owner can see each of them (so a 404 below is authorisation, not a bad fixture).
	for _, p := range []string{"/v1/sandboxes/" + v.sandbox, "/v1/snapshots/" + v.snapshot, fmt.Sprintf("/v1/sandboxes/%s/processes", v.sandbox)} {
		if r := e.doKey(v.key, "GET", p, ""); r.status != 200 {
			t.Fatalf("owner GET %s: %d %s", p, r.status, r.body)
		}
	}
	// No answer may carry the victim's tokens or secret value; an answer of a route that names
	// nothing of the victim's may not name its resources either (a 404 may echo the ID asked for).
	secrets := []string{v.accessToken, v.token, "s3cr3t"}
	names := []string{v.sandbox, v.snapshot, v.secret, v.keyID}

	routes := make([]string, 0, len(tenancyRoutes))
	for r := range tenancyRoutes {
		routes = append(routes, r)
	}
	sort.Strings(routes)
	before := tenancyState(t, e, v)
	for _, route := range routes {
		c := tenancyRoutes[route]
		open := route == "GET /healthz" || route == "GET /metrics"
		for _, who := range []struct{ name, key string }{{"other-tenant", mallory}, {"revoked", revoked}, {"no-key", ""}} {
			t.Run(route+"/"+who.name, func(t *testing.T) {
				status, body := tenancyRequest(t, url, v, route, c, who.key)
				switch {
				case open:
					if status != 200 {
						t.Errorf("status %d, want 200", status)
					}
				case strings.HasPrefix(route, "ENVD ") || strings.HasPrefix(route, "PORT "):
					// No API key there: the sandbox's envd access token or traffic token decides.
					if status != 401 && status != 403 {
						t.Errorf("status %d (%s), want 401 or 403 without the sandbox's token", status, body)
					}
				case who.name != "other-tenant":
					if status != 401 {
						t.Errorf("status %d (%s), want 401", status, body)
					}
				case c.own:
					if status >= 500 {
						t.Errorf("status %d (%s)", status, body)
					}
				default:
					if status != 403 && status != 404 {
						t.Errorf("status %d (%s), want 403 or 404", status, body)
					}
				}
				leaks := secrets
				if c.own && !strings.Contains(route, "{") {
					leaks = append(slices.Clone(secrets), names...)
				}
				for _, s := range leaks {
					if bytes.Contains(body, []byte(s)) {
						t.Errorf("answer names the victim's %q: %s", s, body)
					}
				}
				if after := tenancyState(t, e, v); after != before {
					t.Fatalf("the victim's state changed:\nbefore:\n%s\nafter:\n%s", before, after)
				}
			})
		}
	}
	// And the victim still has it all.
	var got struct{ Sandboxes []struct{ ID, State string } }
	e.doKey(v.key, "GET", "/v1/sandboxes", "").json(t, &got)
	if len(got.Sandboxes) != 1 || got.Sandboxes[0].State != "running" {
		t.Fatalf("victim's sandboxes after the walk: %+v", got)
	}
}
