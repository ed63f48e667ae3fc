package e2e

// The tenancy red team: one tenant (mallory), a revoked key and no key against another tenant's
// (the victim's) sandboxes, snapshot, secret, process and key, on every route the native API
// (docs/openapi.json, which TestOpenAPIRoutes keeps equal to the registered routes) and the E2B
// control plane (internal/e2b's registered patterns) serve, plus the envd and port host-name
// routes; the admin key after rotation; the port host route on a paused sandbox; the
// deduplicating chunk store as an oracle through stored_bytes; /metrics label cardinality.
// Judged by the victim's state as the victim and the admin see it, never by the attacker's
// report.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// rtTenancyCase says how an attacker calls a route: a body and query valid for the owner, so
// that only authorisation can refuse it. own: the route names nothing of another tenant's
// (lists, creates, the caller's own secret namespace); another tenant's key may succeed there
// but must see nothing of the victim's.
type rtTenancyCase struct {
	query, body string
	own         bool
}

// rtTenancyRoutes must cover every route; the test fails on one it does not know.
var rtTenancyRoutes = map[string]rtTenancyCase{
	"GET /healthz": {own: true}, "GET /metrics": {own: true}, "GET /v1/info": {own: true},
	"POST /v1/keys": {body: `{"tenant":"victim"}`, own: true}, "GET /v1/keys": {own: true}, "GET /v1/events": {own: true},
	"DELETE /v1/keys/{id}":                                {},
	"POST /v1/sandboxes":                                  {body: `{"template":"minimal","from_snapshot":"$SNAP"}`},
	"GET /v1/sandboxes":                                   {own: true},
	"GET /v1/sandboxes/{id}":                              {},
	"DELETE /v1/sandboxes/{id}":                           {},
	"POST /v1/sandboxes/{id}/timeout":                     {body: `{"timeout_seconds":5}`},
	"POST /v1/sandboxes/{id}/pause":                       {},
	"POST /v1/sandboxes/{id}/resume":                      {},
	"POST /v1/sandboxes/{id}/fork":                        {body: `{"count":1}`},
	"PATCH /v1/sandboxes/{id}/network":                    {body: `{"egress":{"default":"allow"}}`},
	"GET /v1/sandboxes/{id}/egress":                       {},
	"GET /v1/sandboxes/{id}/ports/{port}/{path...}":       {},
	"POST /v1/sandboxes/{id}/ports/{port}/{path...}":      {body: `x`},
	"PUT /v1/sandboxes/{id}/ports/{port}/{path...}":       {body: `x`},
	"PATCH /v1/sandboxes/{id}/ports/{port}/{path...}":     {body: `x`},
	"DELETE /v1/sandboxes/{id}/ports/{port}/{path...}":    {},
	"POST /v1/sandboxes/{id}/snapshots":                   {body: `{"kind":"filesystem"}`},
	"GET /v1/sandboxes/{id}/snapshots":                    {},
	"POST /v1/sandboxes/{id}/restore":                     {body: `{"snapshot_id":"$SNAP","paths":["/root/canary"]}`},
	"GET /v1/sandboxes/{id}/lineage":                      {},
	"GET /v1/snapshots":                                   {own: true},
	"GET /v1/snapshots/{sid}":                             {},
	"DELETE /v1/snapshots/{sid}":                          {},
	"GET /v1/snapshots/{sid}/diff":                        {query: "against=$SNAP"},
	"POST /v1/sandboxes/{id}/exec":                        {body: `{"command":"echo pwned > /root/canary"}`},
	"GET /v1/sandboxes/{id}/processes":                    {},
	"POST /v1/sandboxes/{id}/code":                        {body: `{"code":"open('/root/canary','w').write('pwned')"}`},
	"GET /v1/sandboxes/{id}/code/contexts":                {},
	"POST /v1/sandboxes/{id}/code/contexts":               {body: `{"language":"python"}`},
	"DELETE /v1/sandboxes/{id}/code/contexts/{ctx}":       {},
	"POST /v1/sandboxes/{id}/code/contexts/{ctx}/restart": {},
	"GET /v1/sandboxes/{id}/processes/{pid}/events":       {},
	"POST /v1/sandboxes/{id}/processes/{pid}/stdin":       {body: `x`},
	"POST /v1/sandboxes/{id}/processes/{pid}/signal":      {body: `{"signal":"SIGKILL"}`},
	"POST /v1/sandboxes/{id}/processes/{pid}/resize":      {body: `{"cols":10,"rows":10}`},
	"PUT /v1/sandboxes/{id}/files":                        {query: "path=/root/canary", body: `pwned`},
	"GET /v1/sandboxes/{id}/files":                        {query: "path=/root/canary"},
	"DELETE /v1/sandboxes/{id}/files":                     {query: "path=/root/canary"},
	"GET /v1/sandboxes/{id}/fs":                           {query: "path=/root"},
	"POST /v1/sandboxes/{id}/fs/mkdir":                    {body: `{"path":"/root/pwned"}`},
	"POST /v1/sandboxes/{id}/fs/move":                     {body: `{"from":"/root/canary","to":"/root/moved"}`},
	"GET /v1/sandboxes/{id}/fs/watch":                     {query: "path=/root"},
	"PUT /v1/secrets/{name}":                              {body: `{"value":"v","hosts":["x.example"]}`, own: true},
	"GET /v1/secrets":                                     {own: true},
	"DELETE /v1/secrets/{name}":                           {},
	"GET /v1/templates":                                   {own: true},
	"POST /v1/templates":                                  {body: `{"name":"rt-t2","from":{"template":"minimal"}}`},
	"DELETE /v1/templates/{name}":                         {},
	"POST /sandboxes":                                     {body: `{"templateID":"$SNAP"}`},
	"POST /v2/sandboxes":                                  {body: `{"templateID":"$SNAP"}`},
	"GET /sandboxes":                                      {own: true},
	"GET /v2/sandboxes":                                   {own: true},
	"GET /sandboxes/{id}":                                 {},
	"DELETE /sandboxes/{id}":                              {},
	"POST /sandboxes/{id}/timeout":                        {body: `{"timeout":5}`},
	"POST /sandboxes/{id}/pause":                          {},
	"POST /sandboxes/{id}/resume":                         {body: `{"timeout":5}`},
	"POST /sandboxes/{id}/connect":                        {body: `{"timeout":5}`},
	"POST /v2/sandboxes/{id}/connect":                     {body: `{"timeout":5}`},
	"GET /sandboxes/{id}/metrics":                         {},
	"PUT /sandboxes/{id}/network":                         {body: `{"allowOut":["example.com"]}`},
	"POST /sandboxes/{id}/snapshots":                      {body: `{}`},
	"GET /snapshots":                                      {own: true},
	"DELETE /templates/{id}":                              {},
	"POST /sandboxes/{id}/fork":                           {body: `{}`},
	"ENVD-HEADER POST /filesystem.Filesystem/Remove":      {body: `{"path":"/root/canary"}`},
	"ENVD-HEADER GET /files":                              {query: "path=/root/canary"},
	"ENVD-HOST POST /process.Process/Start":               {body: `{"process":{"cmd":"/bin/sh","args":["-c","echo pwned > /root/canary"]}}`},
	"PORT-HOST GET /":                                     {},
}

// rtRoutes lists the routes spaced serves: the native ones from docs/openapi.json, the E2B ones
// from internal/e2b's registrations.
func rtRoutes(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../docs/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for p, item := range doc.Paths {
		for m := range item {
			if slices.Contains([]string{"get", "put", "post", "delete", "patch", "head", "options"}, m) {
				out = append(out, strings.ToUpper(m)+" "+p)
			}
		}
	}
	src, err := os.ReadFile("../internal/e2b/e2b.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`a\("([A-Z]+ /[^"]*)"`).FindAllStringSubmatch(string(src), -1) {
		out = append(out, m[1])
	}
	if !slices.Contains(out, "POST /v1/sandboxes") || !slices.Contains(out, "POST /sandboxes") {
		t.Fatalf("route list %v: is the parsing still right?", out)
	}
	sort.Strings(out)
	return out
}

type rtVictim struct {
	key, keyID, sandbox, paused, snapshot, secret, canary string
	pid                                                   int
	accessToken, trafficToken                             string
}

// rtHTTP sends one request; streams are read for at most 3 s.
func rtHTTP(t *testing.T, method, url, host, key, body string, hdr ...string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
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
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<16))
	return res.StatusCode, b
}

// rtTenancyState is the victim's state as the victim and the admin see it.
func rtTenancyState(t *testing.T, d *spacedtest.Daemon, v rtVictim) string {
	t.Helper()
	var out strings.Builder
	for _, get := range []struct{ key, path string }{
		{v.key, "/v1/sandboxes"}, {v.key, "/v1/snapshots"}, {v.key, "/v1/secrets"},
		{v.key, "/v1/sandboxes/" + v.sandbox + "/processes"},
		{v.key, "/v1/sandboxes/" + v.sandbox + "/files?path=/root/canary"},
		{v.key, "/v1/sandboxes/" + v.sandbox + "/fs?path=/root"},
		{d.Opts.Key, "/v1/keys"}, {d.Opts.Key, "/v1/templates"},
	} {
		status, body := rtHTTP(t, "GET", d.URL+get.path, "", get.key, "")
		fmt.Fprintf(&out, "%s %d %s\n", get.path, status, body)
	}
	return out.String()
}

func TestTenancyRedTeam(t *testing.T) {
	binDir(t)
	rt := newRedTeam(t)
	t.Cleanup(func() { rt.report(t) })
	d := startSpaced(t, "SPACE_WARM_POOL=0", "SPACE_DOMAIN=sandbox.test")
	ctx := ctxT(t)
	admin := d.Client

	newKey := func(tenant string) (*client.APIKey, *client.Client) {
		t.Helper()
		k, err := admin.CreateKey(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(d.URL, k.Key)
		if err != nil {
			t.Fatal(err)
		}
		return k, c
	}
	vk, vc := newKey("victim")
	mk, mc := newKey("mallory")
	rk, _ := newKey("victim")
	if err := admin.RevokeKey(ctx, rk.ID); err != nil {
		t.Fatal(err)
	}
	// Sandboxes of tenants other than the admin's are this test's to delete (before
	// startSpaced's cleanup, which sees only the admin's).
	var owned []struct {
		c  *client.Client
		id string
	}
	t.Cleanup(func() {
		for _, o := range owned {
			if snaps, err := o.c.ListSnapshots(context.Background(), o.id); err == nil {
				for _, s := range snaps {
					o.c.DeleteSnapshot(context.Background(), s.ID)
				}
			}
			o.c.DeleteSandbox(context.Background(), o.id)
		}
	})
	e2bCreate := func(key string) (id, access, traffic string) {
		t.Helper()
		status, body := rtHTTP(t, "POST", d.URL+"/sandboxes", "", key, `{"templateID":"minimal","timeout":1800,"network":{"allowPublicTraffic":false}}`)
		var sb struct{ SandboxID, EnvdAccessToken, TrafficAccessToken string }
		if err := json.Unmarshal(body, &sb); err != nil || status != 201 || sb.TrafficAccessToken == "" {
			t.Fatalf("e2b create: %d %s", status, body)
		}
		return sb.SandboxID, sb.EnvdAccessToken, sb.TrafficAccessToken
	}

	v := rtVictim{key: vk.Key, keyID: vk.ID, secret: "victim-secret", canary: "RTC-tenant-" + spacedtest.RandomHex(12)}
	v.sandbox, v.accessToken, v.trafficToken = e2bCreate(v.key)
	owned = append(owned, struct {
		c  *client.Client
		id string
	}{vc, v.sandbox})
	if _, err := vc.Upload(ctx, v.sandbox, "/root/canary", strings.NewReader(v.canary), nil); err != nil {
		t.Fatal(err)
	}
	pid, err := vc.ExecBackground(ctx, v.sandbox, client.ExecRequest{Command: "sleep 3000"})
	if err != nil {
		t.Fatal(err)
	}
	v.pid = pid
	snap, err := vc.CreateSnapshot(ctx, v.sandbox, "filesystem", "victim")
	if err != nil {
		t.Fatal(err)
	}
	v.snapshot = snap.ID
	if err := vc.PutSecret(ctx, v.secret, client.PutSecretRequest{Value: "RTC-secret-value-" + spacedtest.RandomHex(8), Hosts: []string{"api.example"}}); err != nil {
		t.Fatal(err)
	}
	var pausedAccess, pausedTraffic string
	v.paused, pausedAccess, pausedTraffic = e2bCreate(v.key)
	owned = append(owned, struct {
		c  *client.Client
		id string
	}{vc, v.paused})
	if _, err := vc.PauseSandbox(ctx, v.paused); err != nil {
		t.Fatal(err)
	}
	rt.needle("victim-canary", []byte(v.canary))
	rt.needle("victim-access-token", []byte(v.accessToken))
	rt.needle("victim-traffic-token", []byte(v.trafficToken))
	rt.needle("paused-access-token", []byte(pausedAccess))
	rt.needle("paused-traffic-token", []byte(pausedTraffic))

	t.Run("routes", func(t *testing.T) { rtTenancyRoutesGroup(t, rt, d, v, mk.Key, rk.Key) })
	t.Run("paused", func(t *testing.T) { rtPausedGroup(t, rt, d, v, mk.Key, pausedTraffic, vc) })
	t.Run("revocation", func(t *testing.T) { rtRevocationGroup(t, rt, d) })
	t.Run("stored-bytes", func(t *testing.T) {
		mallorySB := create(t, mc, client.CreateSandboxRequest{Template: "minimal", TimeoutSeconds: 1800}).ID
		owned = append(owned, struct {
			c  *client.Client
			id string
		}{mc, mallorySB})
		victimSB := create(t, vc, client.CreateSandboxRequest{Template: "minimal", TimeoutSeconds: 1800}).ID
		owned = append(owned, struct {
			c  *client.Client
			id string
		}{vc, victimSB})
		rtStoredBytes(t, rt, vc, victimSB, mc, mallorySB)
	})
	t.Run("metrics", func(t *testing.T) { rtMetricsGroup(t, rt, d, admin) })
	t.Run("rotation", func(t *testing.T) { rtRotationGroup(t, rt, d, v) })
}

func rtTenancyRoutesGroup(t *testing.T, rt *redTeam, d *spacedtest.Daemon, v rtVictim, mallory, revoked string) {
	routes := rtRoutes(t)
	for _, r := range routes {
		if _, ok := rtTenancyRoutes[r]; !ok {
			t.Errorf("route %s is served but rtTenancyRoutes does not say how to attack it: add it", r)
		}
	}
	all := slices.Clone(routes)
	for r := range rtTenancyRoutes {
		if strings.HasPrefix(r, "ENVD-") || strings.HasPrefix(r, "PORT-") {
			all = append(all, r)
		} else if !slices.Contains(routes, r) {
			t.Errorf("rtTenancyRoutes lists %s, which is not served", r)
		}
	}
	sort.Strings(all)
	expand := strings.NewReplacer("$SNAP", v.snapshot)
	fill := func(p string) string {
		id := v.sandbox
		if strings.HasPrefix(p, "/v1/keys/") {
			id = v.keyID
		}
		if strings.HasPrefix(p, "/templates/") {
			id = v.snapshot
		}
		name := v.secret
		if strings.HasPrefix(p, "/v1/templates/") {
			name = "minimal"
		}
		return strings.NewReplacer("{id}", id, "{sid}", v.snapshot, "{name}", name, "{pid}", fmt.Sprint(v.pid),
			"{port}", "8080", "{path}", "x", "{path...}", "x", "{ctx}", "default").Replace(p)
	}
	before := rtTenancyState(t, d, v)
	for _, route := range all {
		c := rtTenancyRoutes[route]
		kind, rest, _ := strings.Cut(route, " ")
		method, path := kind, rest
		host, hdr := "", []string{"Content-Type", "application/json"}
		switch kind {
		case "ENVD-HEADER":
			method, path, _ = strings.Cut(rest, " ")
			hdr = append(hdr, "E2b-Sandbox-Id", v.sandbox)
		case "ENVD-HOST":
			method, path, _ = strings.Cut(rest, " ")
			host = "49983-" + v.sandbox + ".sandbox.test"
		case "PORT-HOST":
			method, path, _ = strings.Cut(rest, " ")
			host = "8080-" + v.sandbox + ".sandbox.test"
		}
		url := d.URL + fill(path)
		if c.query != "" {
			url += "?" + expand.Replace(c.query)
		}
		open := route == "GET /healthz" || route == "GET /metrics"
		for _, who := range []struct{ name, key string }{{"other-tenant", mallory}, {"revoked-key", revoked}, {"no-key", ""}} {
			status, body := rtHTTP(t, method, url, host, who.key, expand.Replace(c.body), hdr...)
			var escape, failure string
			switch {
			case status == 0 || status >= 500:
				failure = fmt.Sprintf("%d %s", status, body)
			case open:
			case kind != method: // envd and port host routes: the sandbox's own tokens decide
				if status != 401 && status != 403 {
					escape = fmt.Sprintf("%d without the sandbox's token: %.200s", status, body)
				}
			case who.name != "other-tenant":
				if status != 401 {
					escape = fmt.Sprintf("%d, want 401: %.200s", status, body)
				}
			case !c.own && status != 403 && status != 404:
				escape = fmt.Sprintf("%d, want 403/404: %.200s", status, body)
			}
			if leaked := rt.found(body, "victim-canary", "victim-access-token", "victim-traffic-token", "paused-access-token", "paused-traffic-token"); len(leaked) > 0 && escape == "" {
				escape = fmt.Sprintf("answer holds %v", leaked)
			}
			if c.own && !strings.Contains(path, "{") && escape == "" {
				for _, id := range []string{v.sandbox, v.paused, v.snapshot, v.secret, v.keyID} {
					if who.name == "other-tenant" && bytes.Contains(body, []byte(id)) && route != "GET /v1/keys" {
						escape = fmt.Sprintf("a list names the victim's %s", id)
					}
				}
			}
			if after := rtTenancyState(t, d, v); after != before && escape == "" {
				escape = "the victim's state changed:\n" + after
				before = after
			}
			rt.judge(t, "tenancy", who.name+"/"+route, escape, failure, fmt.Sprintf("%d", status))
		}
	}
}

// rtPausedGroup: unauthenticated and other-tenant requests for a paused sandbox's ports and
// envd must not resume it; its state, as its owner sees it, decides.
func rtPausedGroup(t *testing.T, rt *redTeam, d *spacedtest.Daemon, v rtVictim, mallory, traffic string, vc *client.Client) {
	ctx := ctxT(t)
	host := "8080-" + v.paused + ".sandbox.test"
	envd := "49983-" + v.paused + ".sandbox.test"
	for _, a := range []struct {
		name, method, path, host, key string
		hdr                           []string
	}{
		{"port-host-no-token", "GET", "/", host, "", nil},
		{"port-host-wrong-token", "GET", "/", host, "", []string{"e2b-traffic-access-token", "wrong"}},
		{"port-host-other-tenant-key", "GET", "/", host, mallory, nil},
		{"envd-host-no-token", "GET", "/files?path=/etc/hostname", envd, "", nil},
		{"envd-host-wrong-token", "GET", "/files?path=/etc/hostname", envd, "", []string{"X-Access-Token", "wrong"}},
		{"envd-header-wrong-token", "POST", "/process.Process/List", "", "", []string{"E2b-Sandbox-Id", v.paused, "X-Access-Token", "wrong", "Content-Type", "application/json"}},
		{"envd-health-no-token", "GET", "/health", envd, "", nil},
		{"native-port-other-tenant", "GET", "/v1/sandboxes/" + v.paused + "/ports/8080/", "", mallory, nil},
		{"native-files-other-tenant", "GET", "/v1/sandboxes/" + v.paused + "/files?path=/etc/hostname", "", mallory, nil},
		{"e2b-connect-other-tenant", "POST", "/sandboxes/" + v.paused + "/connect", "", mallory, nil},
	} {
		// Each attempt starts from a paused sandbox, whatever the one before did.
		if sb, err := vc.GetSandbox(ctx, v.paused); err == nil && sb.State != "paused" {
			if _, err := vc.PauseSandbox(ctx, v.paused); err != nil {
				t.Fatal(err)
			}
		}
		status, body := rtHTTP(t, a.method, d.URL+a.path, a.host, a.key, "", a.hdr...)
		var escape, failure string
		sb, err := vc.GetSandbox(ctx, v.paused)
		switch {
		case err != nil:
			failure = err.Error()
		case sb.State != "paused":
			escape = fmt.Sprintf("the sandbox is %s after %d %.120s", sb.State, status, body)
		case status >= 200 && status < 300:
			escape = fmt.Sprintf("%d %.120s", status, body)
		case status >= 500 && a.name != "envd-health-no-token": // /health of a not-running sandbox is 502 by E2B's protocol
			failure = fmt.Sprintf("%d %.120s", status, body)
		}
		rt.judge(t, "tenancy", "paused/"+a.name, escape, failure, fmt.Sprintf("%d, still paused", status))
	}
	// Control: with the traffic token the route resumes it (so the judge above can see a resume).
	status, _ := rtHTTP(t, "GET", d.URL+"/", host, "", "", "e2b-traffic-access-token", traffic)
	sb, err := vc.GetSandbox(ctx, v.paused)
	failure := ""
	if err != nil || sb.State != "running" {
		failure = fmt.Sprintf("with the token (%d) the sandbox is %v %v: the control failed", status, sb, err)
	}
	rt.judge(t, "tenancy", "paused/control-with-traffic-token-resumes", "", failure, "")
}

// rtRevocationGroup: a revoked key ends its open event stream and fails its next request.
func rtRevocationGroup(t *testing.T, rt *redTeam, d *spacedtest.Daemon) {
	ctx := ctxT(t)
	k, err := d.Client.CreateKey(ctx, "short-lived")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", d.URL+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+k.Key)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("events: %v %v", res, err)
	}
	ended := make(chan struct{})
	go func() {
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		close(ended)
	}()
	if err := d.Client.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	escape := ""
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		escape = "the event stream under the revoked key is open 5 s after revocation"
		res.Body.Close()
	}
	rt.judge(t, "tenancy", "revoked-key/open-event-stream", escape, "", "")
	status, body := rtHTTP(t, "GET", d.URL+"/v1/sandboxes", "", k.Key, "")
	escape = ""
	if status != 401 {
		escape = fmt.Sprintf("%d %s", status, body)
	}
	rt.judge(t, "tenancy", "revoked-key/next-request", escape, "", fmt.Sprint(status))
}

// rtStoredBytes: two tenants snapshot the same random file; the second must be charged as
// much as the first, or stored_bytes tells it that someone else holds the data.
func rtStoredBytes(t *testing.T, rt *redTeam, vc *client.Client, victimSB string, mc *client.Client, mallorySB string) {
	ctx := ctxT(t)
	data := make([]byte, 8<<20)
	rand.Read(data)
	var stored [2]int64
	for i, s := range []struct {
		c  *client.Client
		id string
	}{{vc, victimSB}, {mc, mallorySB}} {
		if _, err := s.c.Upload(ctx, s.id, "/root/shared.bin", bytes.NewReader(data), nil); err != nil {
			t.Fatal(err)
		}
		snap, err := s.c.CreateSnapshot(ctx, s.id, "filesystem", "")
		if err != nil {
			t.Fatal(err)
		}
		stored[i] = snap.StoredBytes
	}
	escape := ""
	if stored[0] < 8<<20 || stored[1] < stored[0]*9/10 {
		escape = fmt.Sprintf("the victim's snapshot stored %d bytes, mallory's of the same data %d: the store told mallory the victim holds it", stored[0], stored[1])
	}
	rt.judge(t, "tenancy", "stored-bytes-oracle", escape, "", fmt.Sprintf("victim %d, mallory %d", stored[0], stored[1]))
}

// rtMetricsGroup: after many sandboxes and made-up methods, /metrics has no more series and
// no sandbox ID.
func rtMetricsGroup(t *testing.T, rt *redTeam, d *spacedtest.Daemon, admin *client.Client) {
	series := func() []string {
		_, body := rtHTTP(t, "GET", d.URL+"/metrics", "", "", "")
		var out []string
		for _, l := range strings.Split(string(body), "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				name, _, _ := strings.Cut(l, " ")
				out = append(out, name)
			}
		}
		return out
	}
	for i := range 50 {
		rtHTTP(t, fmt.Sprintf("RT%dX", i), d.URL+"/v1/sandboxes", "", "", "")
	}
	series()
	before := series()
	var ids []string
	for range 12 {
		ids = append(ids, create(t, admin, client.CreateSandboxRequest{Template: "minimal"}).ID)
	}
	for i := range 200 {
		rtHTTP(t, fmt.Sprintf("M%d", i), d.URL+"/v1/sandboxes/"+ids[i%len(ids)], "", d.Opts.Key, "")
		rtHTTP(t, "GET", d.URL+"/v1/sandboxes/"+ids[i%len(ids)], "", d.Opts.Key, "")
	}
	after := series()
	_, body := rtHTTP(t, "GET", d.URL+"/metrics", "", "", "")
	escape := ""
	for _, id := range ids {
		if bytes.Contains(body, []byte(id)) {
			escape = "/metrics names sandbox " + id
		}
	}
	if len(after) > len(before)+3 || len(after) > 60 { // + the new states' and GET 200's series
		escape = fmt.Sprintf("series grew from %d to %d: %v", len(before), len(after), after)
	}
	rt.judge(t, "tenancy", "metrics-label-cardinality", escape, "", fmt.Sprintf("%d series before, %d after 12 sandboxes and 250 made-up methods", len(before), len(after)))
	for _, id := range ids {
		admin.DeleteSandbox(context.Background(), id)
	}
}

// rtRotationGroup: spaced restarted with a new SPACE_ADMIN_KEY no longer takes the old one;
// the tenants' keys and sandboxes stay.
func rtRotationGroup(t *testing.T, rt *redTeam, d *spacedtest.Daemon, v rtVictim) {
	ctx := ctxT(t)
	old := d.Opts.Key
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Opts.Key = "e2b_" + spacedtest.RandomHex(20)
	if err := d.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	rt.needle("old-admin-key", []byte(old))
	status, body := rtHTTP(t, "GET", d.URL+"/v1/keys", "", old, "")
	escape := ""
	if status != 401 {
		escape = fmt.Sprintf("the old admin key still answers %d: %.200s", status, body)
	}
	rt.judge(t, "tenancy", "rotation/old-admin-key", escape, "", fmt.Sprint(status))
	status, body = rtHTTP(t, "GET", d.URL+"/v1/keys", "", d.Opts.Key, "")
	failure := ""
	if status != 200 || bytes.Contains(body, []byte(old)) {
		failure = fmt.Sprintf("the new admin key: %d %.200s", status, body)
	}
	if status, _ := rtHTTP(t, "GET", d.URL+"/v1/sandboxes/"+v.sandbox, "", v.key, ""); status != 200 {
		failure += fmt.Sprintf("; the victim's key after rotation: %d", status)
	}
	rt.judge(t, "tenancy", "rotation/new-admin-key-and-tenants-kept", "", failure, "")
}
