// Package storetest is the conformance suite for store.Store: every implementation's tests call
// Run, so that they all behave alike. Only _test.go files import it.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

// Run runs the suite. open returns a new, empty store for each subtest; Run closes it.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"APIKeys", testAPIKeys},
		{"APIKeyNotFound", testAPIKeyNotFound},
		{"APIKeyAlreadyExists", testAPIKeyAlreadyExists},
		{"APIKeyDelete", testAPIKeyDelete},
		{"SandboxCRUD", testSandboxCRUD},
		{"SandboxNotFound", testSandboxNotFound},
		{"SandboxAlreadyExists", testSandboxAlreadyExists},
		{"SandboxRoundTrip", testSandboxRoundTrip},
		{"ListFilters", testListFilters},
		{"ListOrder", testListOrder},
		{"ConcurrentWriters", testConcurrentWriters},
		{"Snapshots", testSnapshots},
		{"Secrets", testSecrets},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tt.fn(t, s)
		})
	}
}

// cmpOpts compares stored records: times by instant, nil and empty maps alike, JSON by value.
var cmpOpts = []cmp.Option{
	cmp.Comparer(func(a, b map[string]string) bool {
		if len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || w != v {
				return false
			}
		}
		return true
	}),
	cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) }),
	cmp.Comparer(func(a, b json.RawMessage) bool {
		if len(a) == 0 || len(b) == 0 {
			return len(a) == len(b)
		}
		var va, vb any
		if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
			return string(a) == string(b)
		}
		return cmp.Equal(va, vb)
	}),
}

// base is a fixed instant with nanoseconds, in a zone other than UTC, to catch stores that
// drop precision or zones.
var base = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.FixedZone("UTC+2", 2*3600))

func sandbox(id, tenant, state string, created time.Time, md map[string]string) store.Sandbox {
	return store.Sandbox{
		ID:             id,
		Tenant:         tenant,
		State:          state,
		Template:       "minimal",
		Runtime:        "gvisor",
		CreatedAt:      created,
		UpdatedAt:      created,
		ExpiresAt:      created.Add(5 * time.Minute),
		TimeoutSeconds: 300,
		OnTimeout:      "kill",
		Metadata:       md,
		Env:            map[string]string{"A": "1"},
		AccessToken:    "tok-" + id,
		SlotIndex:      -1,
		Spec:           json.RawMessage(`{"resources":{"vcpus":1}}`),
	}
}

func testAPIKeys(t *testing.T, s store.Store) {
	ctx := context.Background()
	keys := []store.APIKey{
		{ID: "key_admin", Hash: "aa", Tenant: "admin", Admin: true, CreatedAt: base},
		{ID: "key_t1", Hash: "bb", Tenant: "t1", CreatedAt: base.Add(time.Second)},
	}
	for _, k := range keys {
		if err := s.CreateAPIKey(ctx, k); err != nil {
			t.Fatalf("CreateAPIKey(%s): %v", k.ID, err)
		}
	}
	for _, want := range keys {
		got, err := s.APIKeyByHash(ctx, want.Hash)
		if err != nil {
			t.Fatalf("APIKeyByHash(%s): %v", want.Hash, err)
		}
		if diff := cmp.Diff(want, got, cmpOpts...); diff != "" {
			t.Errorf("APIKeyByHash(%s) (-want +got):\n%s", want.Hash, diff)
		}
	}
	got, err := s.ListAPIKeys(ctx)
	if err != nil {
		t.Fatalf("ListAPIKeys: %v", err)
	}
	if diff := cmp.Diff(keys, got, cmpOpts...); diff != "" {
		t.Errorf("ListAPIKeys (-want +got):\n%s", diff)
	}
}

func testAPIKeyNotFound(t *testing.T, s store.Store) {
	_, err := s.APIKeyByHash(context.Background(), "missing")
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("APIKeyByHash(missing) = %v, want ErrNotFound", err)
	}
}

func testAPIKeyDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, k := range []store.APIKey{
		{ID: "k1", Hash: "h1", Tenant: "t", CreatedAt: base},
		{ID: "k2", Hash: "h2", Tenant: "t", CreatedAt: base.Add(time.Second)},
	} {
		if err := s.CreateAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteAPIKey(ctx, "k1"); err != nil {
		t.Fatalf("DeleteAPIKey(k1): %v", err)
	}
	if _, err := s.APIKeyByHash(ctx, "h1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("APIKeyByHash of a deleted key = %v, want ErrNotFound", err)
	}
	if _, err := s.APIKeyByHash(ctx, "h2"); err != nil {
		t.Errorf("the other key went too: %v", err)
	}
	if err := s.DeleteAPIKey(ctx, "k1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteAPIKey(k1) again = %v, want ErrNotFound", err)
	}
	if keys, err := s.ListAPIKeys(ctx); err != nil || len(keys) != 1 || keys[0].ID != "k2" {
		t.Errorf("ListAPIKeys after delete = %+v, %v; want only k2", keys, err)
	}
}

func testAPIKeyAlreadyExists(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.CreateAPIKey(ctx, store.APIKey{ID: "k1", Hash: "h1", Tenant: "t", CreatedAt: base}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []store.APIKey{
		{ID: "k1", Hash: "h2", Tenant: "t", CreatedAt: base}, // same ID
		{ID: "k2", Hash: "h1", Tenant: "t", CreatedAt: base}, // same hash
	} {
		if err := s.CreateAPIKey(ctx, k); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("CreateAPIKey(%s, %s) = %v, want ErrAlreadyExists", k.ID, k.Hash, err)
		}
	}
	keys, err := s.ListAPIKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Errorf("after refused duplicates, %d keys stored, want 1", len(keys))
	}
}

func testSandboxCRUD(t *testing.T, s store.Store) {
	ctx := context.Background()
	sb := sandbox("sbx_1", "t1", "creating", base, map[string]string{"k": "v"})
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	got, err := s.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	if diff := cmp.Diff(sb, got, cmpOpts...); diff != "" {
		t.Errorf("GetSandbox after create (-want +got):\n%s", diff)
	}

	// Update replaces every field, including emptying maps and the spec.
	sb.State = "error"
	sb.Error = "runtime crashed"
	sb.UpdatedAt = base.Add(time.Minute)
	sb.ExpiresAt = time.Time{}
	sb.Metadata = nil
	sb.Env = map[string]string{"B": "2"}
	sb.SlotIndex = 7
	sb.Spec = nil
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	got, err = s.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	if diff := cmp.Diff(sb, got, cmpOpts...); diff != "" {
		t.Errorf("GetSandbox after update (-want +got):\n%s", diff)
	}

	if err := s.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	if _, err := s.GetSandbox(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSandbox after delete = %v, want ErrNotFound", err)
	}
	list, err := s.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Errorf("ListSandboxes after delete = %d sandboxes, want 0", len(list))
	}
}

func testSandboxNotFound(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.GetSandbox(ctx, "sbx_missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSandbox = %v, want ErrNotFound", err)
	}
	if err := s.UpdateSandbox(ctx, sandbox("sbx_missing", "t", "running", base, nil)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("UpdateSandbox = %v, want ErrNotFound", err)
	}
	if err := s.DeleteSandbox(ctx, "sbx_missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteSandbox = %v, want ErrNotFound", err)
	}
	// Update must not have created it.
	if _, err := s.GetSandbox(ctx, "sbx_missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSandbox after update of missing = %v, want ErrNotFound", err)
	}
}

func testSandboxAlreadyExists(t *testing.T, s store.Store) {
	ctx := context.Background()
	first := sandbox("sbx_dup", "t1", "running", base, map[string]string{"n": "1"})
	if err := s.CreateSandbox(ctx, first); err != nil {
		t.Fatal(err)
	}
	second := sandbox("sbx_dup", "t2", "creating", base, map[string]string{"n": "2"})
	if err := s.CreateSandbox(ctx, second); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("CreateSandbox(duplicate) = %v, want ErrAlreadyExists", err)
	}
	got, err := s.GetSandbox(ctx, "sbx_dup")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, got, cmpOpts...); diff != "" {
		t.Errorf("duplicate create changed the record (-want +got):\n%s", diff)
	}
}

// testSandboxRoundTrip checks that every field, including awkward values, comes back equal.
func testSandboxRoundTrip(t *testing.T, s store.Store) {
	ctx := context.Background()
	tests := []struct {
		name string
		sb   store.Sandbox
	}{
		{"nil maps and spec", store.Sandbox{ID: "sbx_empty", SlotIndex: -1, CreatedAt: base}},
		{"zero times", store.Sandbox{ID: "sbx_zero", Spec: json.RawMessage(`{}`)}},
		{"nested spec", func() store.Sandbox {
			sb := sandbox("sbx_spec", "t", "running", base, nil)
			sb.Spec = json.RawMessage(`{"resources":{"vcpus":2,"memory_mib":512},` +
				`"network":{"egress":{"default":"deny","allow":["*.pypi.org"]},"credentials":["github"]},` +
				`"parent":{"sandbox_id":"sbx_p","snapshot_id":"snp_1"},"unicode":"żółw \u00e9 ☃","n":null}`)
			return sb
		}()},
		{"awkward strings", func() store.Sandbox {
			sb := sandbox("sbx_awk'\"", "tenant with spaces", "paused", base, map[string]string{
				"":             "empty key",
				"a.b":          "dots",
				"$.x":          "json path",
				"quote\"'":     "q",
				"unicode-ключ": "значение",
				"newline":      "a\nb",
			})
			sb.Env = map[string]string{"PATH": "/bin:/usr/bin", "EMPTY": ""}
			sb.Error = "multi\nline \\ backslash"
			return sb
		}()},
		{"far times", func() store.Sandbox {
			sb := sandbox("sbx_far", "t", "running", time.Date(1970, 1, 1, 0, 0, 0, 1, time.UTC), nil)
			sb.ExpiresAt = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
			return sb
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.CreateSandbox(ctx, tt.sb); err != nil {
				t.Fatalf("CreateSandbox: %v", err)
			}
			got, err := s.GetSandbox(ctx, tt.sb.ID)
			if err != nil {
				t.Fatalf("GetSandbox: %v", err)
			}
			if diff := cmp.Diff(tt.sb, got, cmpOpts...); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			if !got.CreatedAt.IsZero() && got.CreatedAt.Location() != time.UTC {
				t.Errorf("CreatedAt location = %v, want UTC", got.CreatedAt.Location())
			}
		})
	}
}

func testListFilters(t *testing.T, s store.Store) {
	ctx := context.Background()
	all := []store.Sandbox{
		sandbox("sbx_a", "t1", "running", base, map[string]string{"team": "x", "env": "prod"}),
		sandbox("sbx_b", "t1", "paused", base.Add(1*time.Second), map[string]string{"team": "x", "env": "dev"}),
		sandbox("sbx_c", "t2", "running", base.Add(2*time.Second), map[string]string{"team": "y"}),
		sandbox("sbx_d", "t2", "error", base.Add(3*time.Second), nil),
		sandbox("sbx_e", "t1", "running", base.Add(4*time.Second), map[string]string{"team.x": "z", "": "e"}),
	}
	for _, sb := range all {
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		f    store.SandboxFilter
		want []string
	}{
		{"everything", store.SandboxFilter{}, []string{"sbx_a", "sbx_b", "sbx_c", "sbx_d", "sbx_e"}},
		{"tenant", store.SandboxFilter{Tenant: "t1"}, []string{"sbx_a", "sbx_b", "sbx_e"}},
		{"unknown tenant", store.SandboxFilter{Tenant: "t3"}, nil},
		{"one state", store.SandboxFilter{States: []string{"running"}}, []string{"sbx_a", "sbx_c", "sbx_e"}},
		{"states", store.SandboxFilter{States: []string{"paused", "error"}}, []string{"sbx_b", "sbx_d"}},
		{"tenant and state", store.SandboxFilter{Tenant: "t2", States: []string{"running"}}, []string{"sbx_c"}},
		{"metadata", store.SandboxFilter{Metadata: map[string]string{"team": "x"}}, []string{"sbx_a", "sbx_b"}},
		{"metadata all pairs", store.SandboxFilter{Metadata: map[string]string{"team": "x", "env": "dev"}}, []string{"sbx_b"}},
		{"metadata no match", store.SandboxFilter{Metadata: map[string]string{"team": "x", "env": "qa"}}, nil},
		{"metadata key with dot", store.SandboxFilter{Metadata: map[string]string{"team.x": "z"}}, []string{"sbx_e"}},
		{"metadata empty key", store.SandboxFilter{Metadata: map[string]string{"": "e"}}, []string{"sbx_e"}},
		{"metadata value must match", store.SandboxFilter{Metadata: map[string]string{"team": "z"}}, nil},
		{"everything at once", store.SandboxFilter{Tenant: "t1", States: []string{"running", "paused"},
			Metadata: map[string]string{"team": "x"}}, []string{"sbx_a", "sbx_b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.ListSandboxes(ctx, tt.f)
			if err != nil {
				t.Fatalf("ListSandboxes: %v", err)
			}
			var ids []string
			for _, sb := range got {
				ids = append(ids, sb.ID)
			}
			if diff := cmp.Diff(tt.want, ids, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("ListSandboxes(%+v) IDs (-want +got):\n%s", tt.f, diff)
			}
		})
	}
	// Listed records are whole records.
	got, err := s.ListSandboxes(ctx, store.SandboxFilter{Tenant: "t1", States: []string{"paused"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]store.Sandbox{all[1]}, got, cmpOpts...); diff != "" {
		t.Errorf("listed record (-want +got):\n%s", diff)
	}
}

// testListOrder checks creation-time order where the text of the times would sort differently
// (fractional seconds of different lengths, different zones).
func testListOrder(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	in := []struct {
		id string
		at time.Time
	}{
		{"sbx_3", t0.Add(time.Second)},
		{"sbx_1", t0},
		{"sbx_2", t0.Add(500 * time.Millisecond)},
		{"sbx_0", t0.Add(-time.Hour).In(time.FixedZone("UTC-5", -5*3600))},
		{"sbx_4", t0.Add(time.Second + time.Nanosecond)},
	}
	for _, x := range in {
		if err := s.CreateSandbox(ctx, sandbox(x.id, "t", "running", x.at, nil)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range got {
		ids = append(ids, sb.ID)
	}
	if diff := cmp.Diff([]string{"sbx_0", "sbx_1", "sbx_2", "sbx_3", "sbx_4"}, ids); diff != "" {
		t.Errorf("ListSandboxes order (-want +got):\n%s", diff)
	}
}

// testConcurrentWriters runs creates, updates, reads and deletes from several goroutines; every
// call must succeed (no "database is locked") and the end state must be exact.
func testConcurrentWriters(t *testing.T, s store.Store) {
	ctx := context.Background()
	const (
		workers = 8
		each    = 25
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers*each*4)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("sbx_w%d_%d", w, i)
				sb := sandbox(id, fmt.Sprintf("t%d", w), "creating", base.Add(time.Duration(i)*time.Millisecond), nil)
				if err := s.CreateSandbox(ctx, sb); err != nil {
					errs <- fmt.Errorf("create %s: %w", id, err)
					continue
				}
				sb.State = "running"
				if err := s.UpdateSandbox(ctx, sb); err != nil {
					errs <- fmt.Errorf("update %s: %w", id, err)
				}
				if _, err := s.ListSandboxes(ctx, store.SandboxFilter{Tenant: sb.Tenant}); err != nil {
					errs <- fmt.Errorf("list: %w", err)
				}
				if i%5 == 0 {
					if err := s.DeleteSandbox(ctx, id); err != nil {
						errs <- fmt.Errorf("delete %s: %w", id, err)
					}
				}
				if err := s.CreateAPIKey(ctx, store.APIKey{ID: "key_" + id, Hash: "h_" + id, Tenant: sb.Tenant, CreatedAt: base}); err != nil {
					errs <- fmt.Errorf("create key %s: %w", id, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	list, err := s.ListSandboxes(ctx, store.SandboxFilter{States: []string{"running"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := workers * (each - each/5); len(list) != want {
		t.Errorf("%d running sandboxes after concurrent writes, want %d", len(list), want)
	}
	keys, err := s.ListAPIKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != workers*each {
		t.Errorf("%d keys after concurrent writes, want %d", len(keys), workers*each)
	}
}

func testSnapshots(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	snaps := []store.Snapshot{
		{ID: "snp_1", Tenant: "t1", SandboxID: "sbx_a", Kind: "filesystem", Label: "first", CreatedAt: base, SizeBytes: 10, StoredBytes: 10},
		{ID: "snp_2", Tenant: "t1", SandboxID: "sbx_a", Kind: "full", ParentID: "snp_1", CreatedAt: base.Add(time.Second), SizeBytes: 1 << 40, StoredBytes: 3},
		{ID: "snp_3", Tenant: "t2", SandboxID: "sbx_b", Kind: "full", CreatedAt: base.Add(2 * time.Second)},
	}
	for _, sn := range snaps {
		if err := s.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateSnapshot(ctx, snaps[0]); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate snapshot: %v", err)
	}
	got, err := s.GetSnapshot(ctx, "snp_2")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(snaps[1], got); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	list, err := s.ListSnapshots(ctx, store.SnapshotFilter{SandboxID: "sbx_a"})
	if err != nil || len(list) != 2 || list[0].ID != "snp_1" || list[1].ID != "snp_2" {
		t.Fatalf("list by sandbox: %+v, %v", list, err)
	}
	list, err = s.ListSnapshots(ctx, store.SnapshotFilter{Tenant: "t2"})
	if err != nil || len(list) != 1 || list[0].ID != "snp_3" {
		t.Fatalf("list by tenant: %+v, %v", list, err)
	}
	if err := s.DeleteSnapshot(ctx, "snp_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSnapshot(ctx, "snp_1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted snapshot: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, "snp_1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

func testSecrets(t *testing.T, s store.Store) {
	ctx := context.Background()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	a := store.Secret{Tenant: "t1", Name: "github", Hosts: []string{"api.github.com"}, Header: "Authorization", Format: "Bearer {value}", Ciphertext: []byte{1, 2, 3}, CreatedAt: at}
	if err := s.PutSecret(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSecret(ctx, store.Secret{Tenant: "t2", Name: "github", Hosts: []string{"x.test"}, Header: "X", Format: "{value}", Ciphertext: []byte{9}, CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSecret(ctx, "t1", "github")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, got); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	a.Ciphertext, a.Hosts = []byte{4, 5}, []string{"a.test", "*.b.test"}
	if err := s.PutSecret(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSecret(ctx, "t1", "github"); len(got.Ciphertext) != 2 || len(got.Hosts) != 2 {
		t.Fatalf("replace: %+v", got)
	}
	if list, err := s.ListSecrets(ctx, "t1"); err != nil || len(list) != 1 {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := s.DeleteSecret(ctx, "t1", "github"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSecret(ctx, "t1", "github"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := s.GetSecret(ctx, "t2", "github"); err != nil {
		t.Fatalf("another tenant's secret of the same name: %v", err)
	}
}
