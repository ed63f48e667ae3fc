// Package auth owns API keys: generating them, storing only their SHA-256 hashes, installing the
// admin key at start, and resolving a presented key to a Principal (tenant, admin). Imported by
// the API layer and cmd/spaced.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/durable"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

// AdminTenant is the tenant of the admin key.
const AdminTenant = "default"

// Principal is who a request acts as.
type Principal struct {
	KeyID  string
	Tenant string
	Admin  bool
}

// Keys resolves, creates and revokes API keys in a store. It is safe for concurrent use.
//
// Every request authenticates against the store, so a revoked key fails on its next request;
// requests still running under it (SSE streams, proxied connections) are ended by Bind.
type Keys struct {
	st  store.Store
	now func() time.Time

	mu      sync.Mutex
	live    map[string]map[*boundRequest]struct{} // key ID → requests running under it
	revoked map[string]bool                       // key IDs revoked since start (IDs never come back)
}

type boundRequest struct{ cancel context.CancelCauseFunc }

// ErrRevoked is the cause of a bound request's context when its key is revoked.
var ErrRevoked = errdefs.New(errdefs.ErrUnauthenticated, "API key revoked")

// New returns Keys over st.
func New(st store.Store) *Keys {
	return &Keys{st: st, now: time.Now, live: map[string]map[*boundRequest]struct{}{}, revoked: map[string]bool{}}
}

// Bind returns a context derived from ctx that is cancelled (cause ErrRevoked) when key keyID
// is revoked, and a function the caller must call when the request ends.
func (k *Keys) Bind(ctx context.Context, keyID string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	br := &boundRequest{cancel: cancel}
	k.mu.Lock()
	if k.revoked[keyID] { // revoked between the request's Authenticate and now
		k.mu.Unlock()
		cancel(ErrRevoked)
		return ctx, func() {}
	}
	set := k.live[keyID]
	if set == nil {
		set = map[*boundRequest]struct{}{}
		k.live[keyID] = set
	}
	set[br] = struct{}{}
	k.mu.Unlock()
	return ctx, func() {
		k.mu.Lock()
		delete(set, br)
		if len(set) == 0 && len(k.live[keyID]) == 0 { // the last one under this key
			delete(k.live, keyID)
		}
		k.mu.Unlock()
		cancel(nil)
	}
}

// List returns every key (never the secret, only the stored record), oldest first.
func (k *Keys) List(ctx context.Context) ([]store.APIKey, error) {
	return k.st.ListAPIKeys(ctx)
}

// Revoke deletes key id: it no longer authenticates, and requests bound to it end at once.
func (k *Keys) Revoke(ctx context.Context, id string) error {
	if err := k.st.DeleteAPIKey(ctx, id); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.NotFound(fmt.Sprintf("key %q not found", id))
		}
		return fmt.Errorf("revoke key: %w", err)
	}
	k.mu.Lock()
	set := k.live[id]
	delete(k.live, id)
	k.revoked[id] = true
	k.mu.Unlock()
	for br := range set {
		br.cancel(ErrRevoked)
	}
	return nil
}

// Hash is the stored form of a key.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Generate returns a new random key. Keys look like E2B's (e2b_ + hex) so that every E2B SDK
// version accepts them.
func Generate() string {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return "e2b_" + hex.EncodeToString(b)
}

// Authenticate resolves a presented key.
func (k *Keys) Authenticate(ctx context.Context, key string) (Principal, error) {
	if key == "" || len(key) > 256 {
		return Principal{}, errdefs.New(errdefs.ErrUnauthenticated, "missing or malformed API key")
	}
	rec, err := k.st.APIKeyByHash(ctx, Hash(key))
	if errors.Is(err, errdefs.ErrNotFound) {
		return Principal{}, errdefs.New(errdefs.ErrUnauthenticated, "invalid API key")
	}
	if err != nil {
		return Principal{}, fmt.Errorf("look up key: %w", err)
	}
	return Principal{KeyID: rec.ID, Tenant: rec.Tenant, Admin: rec.Admin}, nil
}

var tenantRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Create makes a new key for tenant and returns it; only its hash is stored.
func (k *Keys) Create(ctx context.Context, tenant string, admin bool) (id, key string, err error) {
	if !tenantRE.MatchString(tenant) {
		return "", "", errdefs.InvalidArgument(fmt.Sprintf("tenant %q: want lowercase letters, digits, - and _ (up to 63)", tenant))
	}
	key = Generate()
	id, err = k.insert(ctx, key, tenant, admin)
	if err != nil {
		return "", "", err
	}
	return id, key, nil
}

// insert stores key's record and returns its ID.
func (k *Keys) insert(ctx context.Context, key, tenant string, admin bool) (string, error) {
	id := "key_" + Hash(key)[:16]
	err := k.st.CreateAPIKey(ctx, store.APIKey{ID: id, Hash: Hash(key), Tenant: tenant, Admin: admin, CreatedAt: k.now().UTC()})
	if err != nil {
		return "", fmt.Errorf("store key: %w", err)
	}
	return id, nil
}

// EnsureAdmin installs the admin key at start. If key is set it is installed (if not already)
// and every other admin key is retired: a changed SPACE_ADMIN_KEY (or one set after a generated
// key) leaves exactly one admin key. Otherwise, if no key exists yet, a new one is generated and
// written to home/admin.key (0600), durably and before its record is stored: a start that fails
// to write the file stores no key, so the next start generates one again rather than finding a
// key nobody has. It returns the path of the key file it wrote, if any.
// Admin keys come only from here (POST /v1/keys makes tenant keys), so retiring them never
// removes a key someone created through the API.
func (k *Keys) EnsureAdmin(ctx context.Context, home, key string) (string, error) {
	if key != "" {
		rec, err := k.st.APIKeyByHash(ctx, Hash(key))
		if err == nil && !rec.Admin {
			return "", errdefs.InvalidArgument("the configured admin key is already a tenant's key (" + rec.ID + "); choose a new one")
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			err = k.st.CreateAPIKey(ctx, store.APIKey{ID: "key_" + Hash(key)[:16], Hash: Hash(key), Tenant: AdminTenant, Admin: true, CreatedAt: k.now().UTC()})
		}
		if err != nil {
			return "", err
		}
		keys, err := k.st.ListAPIKeys(ctx)
		if err != nil {
			return "", err
		}
		retired := map[string]bool{}
		for _, old := range keys {
			if old.Admin && old.Hash != Hash(key) {
				if err := k.Revoke(ctx, old.ID); err != nil {
					return "", fmt.Errorf("retire old admin key %s: %w", old.ID, err)
				}
				retired[old.Hash] = true
			}
		}
		// A generated admin.key holding a retired key would only mislead the CLI (which reads
		// it when SPACE_API_KEY is unset): remove it. Any other content is left alone.
		path := filepath.Join(home, "admin.key")
		if b, err := os.ReadFile(path); err == nil && retired[Hash(strings.TrimSpace(string(b)))] {
			if err := os.Remove(path); err != nil {
				return "", fmt.Errorf("remove retired admin key file: %w", err)
			}
		}
		return "", nil
	}
	keys, err := k.st.ListAPIKeys(ctx)
	if err != nil {
		return "", err
	}
	path := filepath.Join(home, "admin.key")
	if len(keys) > 0 {
		return "", nil
	}
	newKey := Generate()
	if err := durable.WriteFile(path, []byte(newKey+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write admin key: %w", err)
	}
	if _, err := k.insert(ctx, newKey, AdminTenant, true); err != nil {
		os.Remove(path) // a key no record backs would only mislead the CLI; the next start writes another
		return "", err
	}
	return path, nil
}

// FromRequestHeaders extracts a key from "Authorization: Bearer" or "X-API-Key".
func FromRequestHeaders(authorization, xAPIKey string) string {
	if v, ok := strings.CutPrefix(authorization, "Bearer "); ok {
		return strings.TrimSpace(v)
	}
	return strings.TrimSpace(xAPIKey)
}
