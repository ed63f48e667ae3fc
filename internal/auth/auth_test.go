package auth_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

func newKeys(t *testing.T) (*auth.Keys, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "db"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return auth.New(st), dir
}

func TestGeneratedAdminKey(t *testing.T) {
	k, dir := newKeys(t)
	ctx := context.Background()
	path, err := k.EnsureAdmin(ctx, dir, "")
	if err != nil || path != filepath.Join(dir, "admin.key") {
		t.Fatalf("EnsureAdmin = %q, %v", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v %v", fi, err)
	}
	b, _ := os.ReadFile(path)
	key := strings.TrimSpace(string(b))
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key) {
		t.Fatalf("key %q does not look like an E2B key", key)
	}
	p, err := k.Authenticate(ctx, key)
	if err != nil || !p.Admin || p.Tenant != auth.AdminTenant {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}
	// A second start generates nothing new.
	if path, err := k.EnsureAdmin(ctx, dir, ""); err != nil || path != "" {
		t.Fatalf("second EnsureAdmin = %q, %v", path, err)
	}
}

func TestConfiguredAdminKeyAndTenants(t *testing.T) {
	k, dir := newKeys(t)
	ctx := context.Background()
	if _, err := k.EnsureAdmin(ctx, dir, "e2b_feedface"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.EnsureAdmin(ctx, dir, "e2b_feedface"); err != nil {
		t.Fatalf("installing the same key twice: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "admin.key")); !os.IsNotExist(err) {
		t.Fatalf("a configured key must not be written to disk: %v", err)
	}
	if p, err := k.Authenticate(ctx, "e2b_feedface"); err != nil || !p.Admin {
		t.Fatalf("configured key: %+v %v", p, err)
	}
	_, key, err := k.Create(ctx, "team-a", false)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := k.Authenticate(ctx, key); err != nil || p.Admin || p.Tenant != "team-a" {
		t.Fatalf("tenant key: %+v %v", p, err)
	}
	for _, bad := range []string{"", "e2b_nope", strings.Repeat("x", 300)} {
		if _, err := k.Authenticate(ctx, bad); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("Authenticate(%.10q) = %v", bad, err)
		}
	}
	for _, bad := range []string{"", "Team", "a b", "../x", strings.Repeat("a", 64)} {
		if _, _, err := k.Create(ctx, bad, false); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(%q) = %v", bad, err)
		}
	}
}

func TestHashIsNotTheKey(t *testing.T) {
	key := auth.Generate()
	if h := auth.Hash(key); h == key || len(h) != 64 || strings.Contains(h, key[4:]) {
		t.Fatalf("hash %q of %q", h, key)
	}
	if auth.FromRequestHeaders("Bearer abc", "") != "abc" || auth.FromRequestHeaders("", " def ") != "def" || auth.FromRequestHeaders("Basic x", "") != "" {
		t.Fatal("header parsing")
	}
}

func TestRevokeEndsKeyAndBoundRequests(t *testing.T) {
	k, dir := newKeys(t)
	ctx := context.Background()
	if _, err := k.EnsureAdmin(ctx, dir, "e2b_admin1"); err != nil {
		t.Fatal(err)
	}
	id, key, err := k.Create(ctx, "team-a", false)
	if err != nil {
		t.Fatal(err)
	}
	otherID, other, err := k.Create(ctx, "team-a", false)
	if err != nil {
		t.Fatal(err)
	}
	bound, done := k.Bind(ctx, id)
	defer done()
	unrelated, done2 := k.Bind(ctx, otherID)
	defer done2()
	if err := k.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(ctx, key); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("revoked key authenticates: %v", err)
	}
	select {
	case <-bound.Done():
		if !errors.Is(context.Cause(bound), auth.ErrRevoked) {
			t.Fatalf("cause %v, want ErrRevoked", context.Cause(bound))
		}
	default:
		t.Fatal("a request bound to the revoked key goes on")
	}
	if unrelated.Err() != nil {
		t.Fatal("revoking one key ended another key's request")
	}
	if _, err := k.Authenticate(ctx, other); err != nil {
		t.Fatalf("the other key of the tenant: %v", err)
	}
	// A request that authenticated just before the revocation and binds just after ends too.
	if late, done := k.Bind(ctx, id); !errors.Is(context.Cause(late), auth.ErrRevoked) {
		t.Fatalf("a request bound after revocation: cause %v, want ErrRevoked", context.Cause(late))
	} else {
		done()
	}
	if err := k.Revoke(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("revoking twice = %v, want not found", err)
	}
	if list, err := k.List(ctx); err != nil || len(list) != 2 {
		t.Fatalf("List = %+v, %v; want the admin key and the other key", list, err)
	}
}

func TestChangedAdminKeyRetiresTheOld(t *testing.T) {
	k, dir := newKeys(t)
	ctx := context.Background()
	// A generated key first, then a configured one, then a changed configured one.
	if _, err := k.EnsureAdmin(ctx, dir, ""); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "admin.key"))
	generated := strings.TrimSpace(string(b))
	_, tenant, err := k.Create(ctx, "team-a", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ key, retired string }{{"e2b_first", generated}, {"e2b_second", "e2b_first"}} {
		if _, err := k.EnsureAdmin(ctx, dir, step.key); err != nil {
			t.Fatal(err)
		}
		if p, err := k.Authenticate(ctx, step.key); err != nil || !p.Admin {
			t.Fatalf("new admin key %s: %+v %v", step.key, p, err)
		}
		if _, err := k.Authenticate(ctx, step.retired); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Fatalf("old admin key still authenticates after rotation to %s: %v", step.key, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "admin.key")); !os.IsNotExist(err) {
			t.Fatalf("admin.key holding the retired key is still there: %v", err)
		}
	}
	// A file that holds no retired key is not ours to remove.
	if err := os.WriteFile(filepath.Join(dir, "admin.key"), []byte("something else\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := k.EnsureAdmin(ctx, dir, "e2b_second"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "admin.key")); err != nil {
		t.Fatalf("an unrelated admin.key went: %v", err)
	}
	if p, err := k.Authenticate(ctx, tenant); err != nil || p.Tenant != "team-a" {
		t.Fatalf("rotation touched a tenant key: %+v %v", p, err)
	}
	// A tenant's key is not accepted as the admin key (it would leave no admin at all).
	if _, err := k.EnsureAdmin(ctx, dir, tenant); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("EnsureAdmin with a tenant key = %v, want invalid argument", err)
	}
	if p, err := k.Authenticate(ctx, "e2b_second"); err != nil || !p.Admin {
		t.Fatalf("refused rotation retired the admin key: %+v %v", p, err)
	}
}

// A start whose admin.key write fails stores no key, so the next start generates one again and
// that key works; the key and its file then survive a restart unchanged.
func TestAdminKeyWriteFailureThenRetry(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	open := func() (*auth.Keys, func()) {
		st, err := sqlite.Open(ctx, filepath.Join(dir, "db"), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		return auth.New(st), func() { st.Close() }
	}
	keyFile := filepath.Join(dir, "admin.key")
	// The write fails at its last step: admin.key is a non-empty directory, so the rename over
	// it fails (a read-only directory would not stop root).
	if err := os.MkdirAll(filepath.Join(keyFile, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	k, closeStore := open()
	if _, err := k.EnsureAdmin(ctx, dir, ""); err == nil {
		t.Fatal("EnsureAdmin succeeded though admin.key could not be written")
	}
	if list, err := k.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("after the failed write the store holds %+v, %v; want no key (it would lock the admin out)", list, err)
	}
	closeStore()
	if err := os.RemoveAll(keyFile); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), "admin.key") {
			t.Fatalf("the failed write left %s", e.Name())
		}
	}

	// The next start.
	k, closeStore = open()
	if path, err := k.EnsureAdmin(ctx, dir, ""); err != nil || path != keyFile {
		t.Fatalf("retry: EnsureAdmin = %q, %v", path, err)
	}
	b, _ := os.ReadFile(keyFile)
	key := strings.TrimSpace(string(b))
	if p, err := k.Authenticate(ctx, key); err != nil || !p.Admin {
		t.Fatalf("retry: the written key: %+v, %v", p, err)
	}
	closeStore()

	// A restart keeps both.
	k, closeStore = open()
	defer closeStore()
	if path, err := k.EnsureAdmin(ctx, dir, ""); err != nil || path != "" {
		t.Fatalf("restart: EnsureAdmin = %q, %v; want nothing new", path, err)
	}
	if b2, _ := os.ReadFile(keyFile); string(b2) != string(b) {
		t.Fatalf("restart changed admin.key: %q, was %q", b2, b)
	}
	if p, err := k.Authenticate(ctx, key); err != nil || !p.Admin {
		t.Fatalf("restart: the admin key: %+v, %v", p, err)
	}
}

// A start that crashed after writing admin.key but before storing its record left a file no
// record backs: the next start replaces it whole with a key that works.
func TestAdminKeyFileWithoutRecordIsReplaced(t *testing.T) {
	k, dir := newKeys(t)
	ctx := context.Background()
	keyFile := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("e2b_stale", 20)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := k.EnsureAdmin(ctx, dir, ""); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(keyFile)
	if p, err := k.Authenticate(ctx, strings.TrimSpace(string(b))); err != nil || !p.Admin {
		t.Fatalf("admin.key %q: %+v, %v", b, p, err)
	}
	if fi, _ := os.Stat(keyFile); fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin.key mode %v, want 0600", fi.Mode().Perm())
	}
}
