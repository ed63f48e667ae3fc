// Package store keeps SPACE's control-plane state (API keys, sandboxes, snapshots) behind the Store
// interface. The embedded SQLite implementation is in store/sqlite; a Postgres one can follow for
// several nodes. Every implementation must pass store/storetest. Only the sandbox lifecycle and
// the API's authentication read or write the store.
package store

import (
	"context"
	"encoding/json"
	"time"
)

// APIKey is a stored API key. The key itself is never stored, only its SHA-256 hash.
type APIKey struct {
	ID        string
	Hash      string // hex SHA-256 of the key
	Tenant    string
	Admin     bool
	CreatedAt time.Time
}

// Sandbox is the stored record of one sandbox. The sandbox lifecycle is its only writer.
type Sandbox struct {
	ID             string
	Tenant         string
	State          string
	Template       string
	Runtime        string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	ExpiresAt      time.Time
	TimeoutSeconds int
	OnTimeout      string
	Metadata       map[string]string
	Env            map[string]string
	AccessToken    string
	SlotIndex      int // network slot lease index, -1 if none
	// Spec holds the rest of the creation request (resources, network, parent) as JSON, so that
	// fields can be added without a migration.
	Spec json.RawMessage
	// Error is a human-readable reason when State is "error".
	Error string
}

// Snapshot is the stored record of one snapshot. Its content (a manifest and chunks) lives in
// the chunk store under the same ID; the record is written after the content is durable.
type Snapshot struct {
	ID          string
	Tenant      string
	SandboxID   string
	Kind        string // filesystem or full
	Label       string
	ParentID    string // the sandbox's previous snapshot, if any
	CreatedAt   time.Time
	SizeBytes   int64 // the state it represents
	StoredBytes int64 // bytes it added to the chunk store
}

// Secret is a stored credential. Its value is only ever stored sealed (Ciphertext); the store
// never sees it in the clear.
type Secret struct {
	Tenant     string
	Name       string
	Hosts      []string // host rules the gateway sets it for
	Header     string
	Format     string // e.g. "Bearer {value}"
	Ciphertext []byte
	CreatedAt  time.Time
}

// SnapshotFilter selects snapshots in ListSnapshots. Empty fields match everything.
type SnapshotFilter struct {
	Tenant    string
	SandboxID string
}

// SandboxFilter selects sandboxes in List. Empty fields match everything.
type SandboxFilter struct {
	Tenant   string
	States   []string
	Metadata map[string]string
}

// Store is SPACE's state. Implementations are safe for concurrent use.
//
// Errors: lookups of missing records return an error wrapping errdefs.ErrNotFound; creating a
// record whose ID exists returns one wrapping errdefs.ErrAlreadyExists.
type Store interface {
	CreateAPIKey(ctx context.Context, k APIKey) error
	// APIKeyByHash finds a key by the hex SHA-256 of its secret.
	APIKeyByHash(ctx context.Context, hash string) (APIKey, error)
	ListAPIKeys(ctx context.Context) ([]APIKey, error)
	// DeleteAPIKey removes the key with this ID (revocation: it no longer authenticates).
	DeleteAPIKey(ctx context.Context, id string) error

	CreateSandbox(ctx context.Context, s Sandbox) error
	// UpdateSandbox replaces the record with ID s.ID.
	UpdateSandbox(ctx context.Context, s Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// ListSandboxes returns matching sandboxes ordered by creation time.
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error

	CreateSnapshot(ctx context.Context, s Snapshot) error
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	// ListSnapshots returns matching snapshots ordered by creation time.
	ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error

	// PutSecret creates or replaces the secret (Tenant, Name).
	PutSecret(ctx context.Context, s Secret) error
	GetSecret(ctx context.Context, tenant, name string) (Secret, error)
	// ListSecrets returns a tenant's secrets ordered by name.
	ListSecrets(ctx context.Context, tenant string) ([]Secret, error)
	DeleteSecret(ctx context.Context, tenant, name string) error

	Close() error
}
