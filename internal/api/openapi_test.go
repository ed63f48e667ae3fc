package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/errdefs"
)

// openAPIPath is the published OpenAPI document, relative to this package.
const openAPIPath = "../../docs/openapi.json"

// oaCatchAll are method-less mux patterns that exist only to turn unknown routes into JSON
// errors; they are not part of the documented API.
var oaCatchAll = []string{"/v1/"}

var oaMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

type oaDoc struct {
	OpenAPI  string                                `json:"openapi"`
	Info     struct{ Title, Version string }       `json:"info"`
	Security []map[string][]string                 `json:"security"`
	Paths    map[string]map[string]json.RawMessage `json:"paths"`
	Planned  []string                              `json:"x-planned"`

	Components struct {
		SecuritySchemes map[string]json.RawMessage `json:"securitySchemes"`
		Parameters      map[string]oaParam         `json:"parameters"`
		Responses       map[string]oaResponse      `json:"responses"`
		Schemas         map[string]json.RawMessage `json:"schemas"`
	} `json:"components"`
}

type oaParam struct {
	Ref      string `json:"$ref"`
	Name     string `json:"name"`
	In       string `json:"in"`
	Required bool   `json:"required"`
}

type oaResponse struct {
	Ref         string `json:"$ref"`
	Description string `json:"description"`
	Content     map[string]struct {
		Schema  json.RawMessage `json:"schema"`
		Example json.RawMessage `json:"example"`
	} `json:"content"`
}

type oaOperation struct {
	OperationID string                 `json:"operationId"`
	Parameters  []oaParam              `json:"parameters"`
	Responses   map[string]oaResponse  `json:"responses"`
	Security    *[]map[string][]string `json:"security"`
}

// oaRoute is one (method, path) pair, as the mux pattern and the document both spell it.
type oaRoute struct{ method, path string }

func (r oaRoute) String() string { return r.method + " " + r.path }

func loadOpenAPI(t *testing.T) (oaDoc, any) {
	t.Helper()
	raw, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatalf("read OpenAPI document: %v", err)
	}
	var doc oaDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("decode %s: %v", openAPIPath, err)
	}
	var tree any
	if err := json.Unmarshal(raw, &tree); err != nil {
		t.Fatalf("decode %s: %v", openAPIPath, err)
	}
	return doc, tree
}

// oaOperations returns every operation of the document by route.
func oaOperations(t *testing.T, doc oaDoc) map[oaRoute]oaOperation {
	t.Helper()
	ops := map[oaRoute]oaOperation{}
	for path, item := range doc.Paths {
		for key, raw := range item {
			if !slices.Contains(oaMethods, key) {
				continue
			}
			var op oaOperation
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: decode operation: %v", key, path, err)
			}
			ops[oaRoute{strings.ToUpper(key), path}] = op
		}
	}
	return ops
}

func TestOpenAPIDocument(t *testing.T) {
	doc, tree := loadOpenAPI(t)
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Errorf("openapi = %q, want 3.1.x", doc.OpenAPI)
	}
	if doc.Info.Title == "" || doc.Info.Version == "" {
		t.Errorf("info.title and info.version must be set, got %+v", doc.Info)
	}
	for _, name := range []string{"Error", "Sandbox", "CreateSandboxRequest", "ExecRequest", "ExecResult", "Process", "Entry"} {
		if _, ok := doc.Components.Schemas[name]; !ok {
			t.Errorf("components.schemas.%s is missing", name)
		}
	}
	if len(doc.Security) == 0 {
		t.Error("no top-level security requirement")
	}
	for _, req := range doc.Security {
		for name := range req {
			if _, ok := doc.Components.SecuritySchemes[name]; !ok {
				t.Errorf("security requirement %q names no security scheme", name)
			}
		}
	}

	ops := oaOperations(t, doc)
	if len(ops) == 0 {
		t.Fatal("the document has no operations")
	}
	ids := map[string]oaRoute{}
	for r, op := range ops {
		if len(op.Responses) == 0 {
			t.Errorf("%s: no responses", r)
		}
		for code := range op.Responses {
			if n, err := strconv.Atoi(code); code != "default" && (err != nil || n < 100 || n > 599) {
				t.Errorf("%s: response key %q is not a status code", r, code)
			}
		}
		if op.OperationID == "" {
			t.Errorf("%s: no operationId", r)
		} else if prev, dup := ids[op.OperationID]; dup {
			t.Errorf("%s: operationId %q already used by %s", r, op.OperationID, prev)
		}
		ids[op.OperationID] = r
		// The server authenticates every /v1 route; only /healthz and /metrics are open.
		open := op.Security != nil && len(*op.Security) == 0
		if strings.HasPrefix(r.path, "/v1/") && open {
			t.Errorf("%s: documented as unauthenticated, but every /v1 oaRoute needs a key", r)
		}
	}
	oaCheckPathParams(t, doc)
	oaCheckRefs(t, tree, tree, "#")
}

// oaCheckPathParams checks that each {placeholder} of a path is declared as a required path
// parameter of every operation under it, and that no other path parameter is declared.
func oaCheckPathParams(t *testing.T, doc oaDoc) {
	t.Helper()
	placeholder := regexp.MustCompile(`\{([^{}]+)\}`)
	resolve := func(p oaParam) oaParam {
		if name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/"); ok {
			return doc.Components.Parameters[name]
		}
		return p
	}
	for path, item := range doc.Paths {
		var want []string
		for _, m := range placeholder.FindAllStringSubmatch(path, -1) {
			want = append(want, m[1])
		}
		sort.Strings(want)
		var common []oaParam
		if raw, ok := item["parameters"]; ok {
			if err := json.Unmarshal(raw, &common); err != nil {
				t.Fatalf("%s: decode parameters: %v", path, err)
			}
		}
		for key, raw := range item {
			if !slices.Contains(oaMethods, key) {
				continue
			}
			var op oaOperation
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: decode operation: %v", key, path, err)
			}
			var got []string
			for _, p := range append(slices.Clone(common), op.Parameters...) {
				p = resolve(p)
				if p.In != "path" {
					continue
				}
				if !p.Required {
					t.Errorf("%s %s: path parameter %q must be required", key, path, p.Name)
				}
				got = append(got, p.Name)
			}
			sort.Strings(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s %s: path parameters %v, want %v", key, path, got, want)
			}
		}
	}
}

// oaCheckRefs reports every local $ref in v that does not resolve within root.
func oaCheckRefs(t *testing.T, root, v any, at string) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		if ref, ok := v["$ref"].(string); ok {
			if _, err := oaPointer(root, ref); err != nil {
				t.Errorf("%s: $ref %q: %v", at, ref, err)
			}
		}
		for k, x := range v {
			oaCheckRefs(t, root, x, at+"/"+k)
		}
	case []any:
		for i, x := range v {
			oaCheckRefs(t, root, x, fmt.Sprintf("%s/%d", at, i))
		}
	}
}

func oaPointer(root any, ref string) (any, error) {
	ptr, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, errors.New("not a local reference")
	}
	cur := root
	for _, tok := range strings.Split(ptr, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%q: parent is not an object", tok)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("%q: no such member", tok)
		}
	}
	return cur, nil
}

// TestOpenAPIErrors checks the document's error codes against statusOf, the one place where
// error classes become statuses: the ErrorCode enum is exactly the set of codes the server can
// send, and every operation response that points at an error component uses that code's status.
func TestOpenAPIErrors(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	statusByCode := map[string]int{}
	for _, err := range []error{
		errdefs.ErrInvalidArgument, errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied,
		errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition,
		errdefs.ErrTooLarge, errdefs.ErrResourceExhausted, errdefs.ErrUnavailable, errdefs.ErrUpstream, errdefs.ErrInsufficientStorage,
		errors.New("anything else"),
	} {
		status, code := statusOf(err)
		if prev, ok := statusByCode[code]; ok && prev != status {
			t.Fatalf("statusOf maps code %q to both %d and %d", code, prev, status)
		}
		statusByCode[code] = status
	}

	var codeSchema struct {
		Enum []string `json:"enum"`
	}
	if err := json.Unmarshal(doc.Components.Schemas["ErrorCode"], &codeSchema); err != nil {
		t.Fatalf("decode components.schemas.ErrorCode: %v", err)
	}
	var serverCodes []string
	for code := range statusByCode {
		serverCodes = append(serverCodes, code)
	}
	sort.Strings(serverCodes)
	docCodes := slices.Sorted(slices.Values(codeSchema.Enum))
	if !slices.Equal(docCodes, serverCodes) {
		t.Errorf("ErrorCode enum = %v, server sends %v", docCodes, serverCodes)
	}

	// Each error response component's example names its code; that code fixes its status.
	componentStatus := map[string]int{}
	for name, resp := range doc.Components.Responses {
		var ex struct {
			Error struct{ Code string } `json:"error"`
		}
		media, ok := resp.Content["application/json"]
		if !ok || len(media.Example) == 0 {
			t.Errorf("components.responses.%s: want an application/json example", name)
			continue
		}
		if err := json.Unmarshal(media.Example, &ex); err != nil {
			t.Errorf("components.responses.%s: example: %v", name, err)
			continue
		}
		status, ok := statusByCode[ex.Error.Code]
		if !ok {
			t.Errorf("components.responses.%s: example code %q is not one the server sends", name, ex.Error.Code)
			continue
		}
		componentStatus[name] = status
	}
	for r, op := range oaOperations(t, doc) {
		for code, resp := range op.Responses {
			name, ok := strings.CutPrefix(resp.Ref, "#/components/responses/")
			if !ok {
				continue
			}
			if want, ok := componentStatus[name]; ok && code != strconv.Itoa(want) {
				t.Errorf("%s: response %s is %s, whose status is %d (%s)", r, code, name, want, http.StatusText(want))
			}
		}
	}
}

// oaMethodPattern matches a method-qualified ServeMux pattern (Go 1.22 syntax).
var oaMethodPattern = regexp.MustCompile(`^(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|CONNECT|TRACE) (\S+)$`)

// oaRegisteredRoutes reads this package's non-test sources and returns the routes handed to the
// mux: the first string-literal argument of every Handle/HandleFunc call, and of any call whose
// first argument is a method-qualified pattern (such as the local `a` helper of routes()).
func oaRegisteredRoutes(t *testing.T) []oaRoute {
	t.Helper()
	return oaRegisteredRoutesIn(t, ".", oaCatchAll)
}

// oaRegisteredRoutesIn is oaRegisteredRoutes for the package in dir, whose method-less
// catch-all patterns are catchAll.
func oaRegisteredRoutesIn(t *testing.T, dir string, catchAll []string) []oaRoute {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no Go sources in %s", dir)
	}
	fset := token.NewFileSet()
	var routes []oaRoute
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			pattern, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatalf("%s: %v", fset.Position(lit.Pos()), err)
			}
			sel, isSel := call.Fun.(*ast.SelectorExpr)
			muxCall := isSel && (sel.Sel.Name == "HandleFunc" || sel.Sel.Name == "Handle")
			m := oaMethodPattern.FindStringSubmatch(pattern)
			switch {
			case m != nil && strings.HasPrefix(m[2], "/"):
				routes = append(routes, oaRoute{m[1], m[2]})
			case m != nil:
				t.Errorf("%s: pattern %q has a host; this test does not know how to document it", fset.Position(lit.Pos()), pattern)
			case muxCall && !slices.Contains(catchAll, pattern):
				t.Errorf("%s: pattern %q matches every method; give it a method, or list it in oaCatchAll if it is not API", fset.Position(lit.Pos()), pattern)
			}
			return true
		})
	}
	return routes
}

func TestOpenAPIRoutes(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	registered := map[oaRoute]bool{}
	for _, r := range oaRegisteredRoutes(t) {
		if registered[r] {
			t.Errorf("%s is registered twice", r)
		}
		registered[r] = true
	}
	// Guard against the parser silently finding nothing (for example if routes() changes shape).
	for _, r := range []oaRoute{{"GET", "/healthz"}, {"POST", "/v1/sandboxes"}, {"POST", "/v1/sandboxes/{id}/exec"}} {
		if !registered[r] {
			t.Fatalf("found %d routes in the sources but not %s; is oaRegisteredRoutes still reading routes()?", len(registered), r)
		}
	}
	documented := map[oaRoute]bool{}
	for r := range oaOperations(t, doc) {
		documented[r] = true
	}
	var undocumented, unserved []string
	for r := range registered {
		if !documented[r] {
			undocumented = append(undocumented, r.String())
		}
	}
	for r := range documented {
		if !registered[r] {
			unserved = append(unserved, r.String())
		}
	}
	sort.Strings(undocumented)
	sort.Strings(unserved)
	for _, r := range undocumented {
		t.Errorf("%s is served but not in %s; document it", r, openAPIPath)
	}
	for _, r := range unserved {
		t.Errorf("%s is in %s but the server does not register it; remove it or list it under x-planned", r, openAPIPath)
	}
	// x-planned names routes not served yet; once one is served it belongs in paths instead.
	for _, p := range doc.Planned {
		m := oaMethodPattern.FindStringSubmatch(p)
		if m == nil {
			continue // a prose entry, such as the E2B surface
		}
		if r := (oaRoute{m[1], m[2]}); registered[r] || documented[r] {
			t.Errorf("x-planned lists %s, which is now served or documented; move it into paths", r)
		}
	}
}
