package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/space-sandbox/space/pkg/client"
)

// TestTemplateBuild builds a template from minimal with steps, makes a sandbox from it, rebuilds
// it from the cache and deletes it.
func TestTemplateBuild(t *testing.T) {
	d := startSpaced(t)
	call := func(method, path, body string, sse bool) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, d.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+d.Opts.Key)
		if sse {
			req.Header.Set("Accept", "text/event-stream")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	recipe := `{"name":"demo","from":{"template":"minimal"},"steps":[
		{"run":"mkdir -p /app && echo hello > /app/greeting && rm /bin/ls && echo step-one-ran"},
		{"env":{"APP":"demo"}},
		{"workdir":"/app"},
		{"copy":{"path":"/app/data.txt","content":"data\n","mode":384}}]}`
	status, log := call("POST", "/v1/templates", recipe, true)
	if status != 200 || !strings.Contains(log, "event: done") || !strings.Contains(log, "step-one-ran") {
		t.Fatalf("first build: %d\n%s", status, log)
	}
	sb := create(t, d.Client, client.CreateSandboxRequest{Template: "demo"})
	res := run(t, d.Client, sb.ID, "cat greeting data.txt; echo $APP; pwd; stat -c %a data.txt; test -e /bin/ls || echo no-ls")
	if res.Stdout != "hello\ndata\ndemo\n/app\n600\nno-ls\n" {
		t.Fatalf("sandbox from the template: %+v", res)
	}

	// Rebuilding the unchanged recipe (through the SDK this time) runs nothing.
	var req client.BuildTemplateRequest
	if err := json.Unmarshal([]byte(recipe), &req); err != nil {
		t.Fatal(err)
	}
	var lines []string
	tpl, err := d.Client.BuildTemplate(ctxT(t), req, func(l string) { lines = append(lines, l) })
	all := strings.Join(lines, "\n")
	if err != nil || tpl.Name != "demo" || strings.Contains(all, "step-one-ran") || strings.Count(all, "cached") != 2 {
		t.Fatalf("cached rebuild: %+v %v\n%s", tpl, err, all)
	}
	// JSON answer, and a failing step is a 4xx that leaves no template behind.
	status, body := call("POST", "/v1/templates", `{"name":"broken","from":{"template":"minimal"},"steps":[{"run":"exit 3"}]}`, false)
	if status != 400 || !strings.Contains(body, "exited with 3") {
		t.Fatalf("failing build: %d %s", status, body)
	}
	status, body = call("POST", "/v1/templates", `{"name":"x","from":{"template":"nope"}}`, false)
	if status != 404 {
		t.Fatalf("unknown parent: %d %s", status, body)
	}
	status, body = call("GET", "/v1/templates", "", false)
	var list struct {
		Templates []struct {
			Name, Parent string
			SizeBytes    int64 `json:"size_bytes"`
		}
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil || status != 200 {
		t.Fatalf("list: %d %s", status, body)
	}
	names := map[string]string{}
	for _, tp := range list.Templates {
		names[tp.Name] = tp.Parent
	}
	if _, ok := names["broken"]; ok || names["demo"] != "minimal" || names["minimal"] != "" {
		t.Fatalf("templates: %+v", list.Templates)
	}
	if status, _ := call("DELETE", "/v1/templates/minimal", "", false); status != 409 {
		t.Fatalf("delete built-in: %d", status)
	}
	if status, _ := call("DELETE", "/v1/templates/demo", "", false); status != 204 {
		t.Fatalf("delete: %d", status)
	}
	// The running sandbox keeps its layers.
	if res := run(t, d.Client, sb.ID, "cat /app/greeting"); res.Stdout != "hello\n" {
		t.Fatalf("after the template was deleted: %+v", res)
	}
}
