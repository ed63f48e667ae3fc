package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// newTenantKey makes a key for tenant through the API and returns its ID and secret.
func (e *env) newTenantKey(tenant string) (id, key string) {
	e.t.Helper()
	r := e.do("POST", "/v1/keys", `{"tenant":"`+tenant+`"}`)
	if r.status != 201 {
		e.t.Fatalf("create key: %d %s", r.status, r.body)
	}
	var k struct{ ID, Key string }
	r.json(e.t, &k)
	return k.ID, k.Key
}

func TestKeysListAndRevoke(t *testing.T) {
	e := newEnv(t)
	id, key := e.newTenantKey("team-a")
	_, other := e.newTenantKey("team-a")

	var list struct {
		Keys []struct {
			ID, Tenant string
			Admin      bool
			CreatedAt  time.Time `json:"created_at"`
		}
	}
	r := e.do("GET", "/v1/keys", "")
	if r.status != 200 {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	r.json(t, &list)
	if len(list.Keys) != 3 || !list.Keys[0].Admin || list.Keys[1].ID != id || list.Keys[1].Tenant != "team-a" || list.Keys[1].CreatedAt.IsZero() {
		t.Fatalf("list = %+v", list)
	}
	if strings.Contains(string(r.body), key) || strings.Contains(string(r.body), e.key) {
		t.Fatal("the key list shows a secret")
	}
	adminID := list.Keys[0].ID

	// Tenants may do neither.
	wantError(t, e.doKey(key, "GET", "/v1/keys", ""), 403, "permission_denied")
	wantError(t, e.doKey(key, "DELETE", "/v1/keys/"+id, ""), 403, "permission_denied")
	// Admin keys are retired by rotation, not here; unknown keys are 404.
	wantError(t, e.do("DELETE", "/v1/keys/"+adminID, ""), 409, "conflict")
	wantError(t, e.do("DELETE", "/v1/keys/key_nope", ""), 404, "not_found")

	// An event stream open under the key ends when it is revoked.
	req, _ := http.NewRequest("GET", e.url+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("events: %v %v", res, err)
	}
	defer res.Body.Close()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for range sseEvents(res.Body) {
		}
	}()

	if r := e.do("DELETE", "/v1/keys/"+id, ""); r.status != 204 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("an event stream under the revoked key is still open 5 s after revocation")
	}
	wantError(t, e.doKey(key, "GET", "/v1/sandboxes", ""), 401, "unauthenticated")
	wantError(t, e.do("DELETE", "/v1/keys/"+id, ""), 404, "not_found")
	if r := e.doKey(other, "GET", "/v1/sandboxes", ""); r.status != 200 {
		t.Fatalf("the tenant's other key: %d %s", r.status, r.body)
	}
	r = e.do("GET", "/v1/keys", "")
	r.json(t, &list)
	if len(list.Keys) != 2 {
		t.Fatalf("after revoke: %+v", list)
	}
}
