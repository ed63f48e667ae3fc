package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// migration is one step of the schema. Version n is the n-th element of migrations; a step is
// never edited once released, only followed by a new one.
type migration struct {
	name string
	sql  string
}

// migrations is the schema, in order. The schema version of a database is the number of steps
// applied to it, recorded one row per step in schema_migrations.
var migrations = []migration{
	{name: "initial", sql: `
CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	hash       TEXT NOT NULL UNIQUE,
	tenant     TEXT NOT NULL,
	admin      INTEGER NOT NULL,
	created_at TEXT NOT NULL
) STRICT;

CREATE TABLE sandboxes (
	id              TEXT PRIMARY KEY,
	tenant          TEXT NOT NULL,
	state           TEXT NOT NULL,
	template        TEXT NOT NULL,
	runtime         TEXT NOT NULL,
	created_at      TEXT NOT NULL,
	updated_at      TEXT NOT NULL,
	expires_at      TEXT NOT NULL,
	timeout_seconds INTEGER NOT NULL,
	on_timeout      TEXT NOT NULL,
	metadata        TEXT NOT NULL CHECK (json_valid(metadata)),
	env             TEXT NOT NULL CHECK (json_valid(env)),
	access_token    TEXT NOT NULL,
	slot_index      INTEGER NOT NULL,
	spec            TEXT CHECK (spec IS NULL OR json_valid(spec)),
	error           TEXT NOT NULL
) STRICT;

CREATE INDEX sandboxes_tenant_created ON sandboxes (tenant, created_at);
CREATE INDEX sandboxes_state ON sandboxes (state);
`},
	{name: "snapshots", sql: `
CREATE TABLE snapshots (
	id           TEXT PRIMARY KEY,
	tenant       TEXT NOT NULL,
	sandbox_id   TEXT NOT NULL,
	kind         TEXT NOT NULL CHECK (kind IN ('filesystem', 'full')),
	label        TEXT NOT NULL,
	parent_id    TEXT NOT NULL,
	created_at   TEXT NOT NULL,
	size_bytes   INTEGER NOT NULL,
	stored_bytes INTEGER NOT NULL
) STRICT;

CREATE INDEX snapshots_sandbox_created ON snapshots (sandbox_id, created_at);
CREATE INDEX snapshots_tenant_created ON snapshots (tenant, created_at);
`},
	{name: "secrets", sql: `
CREATE TABLE secrets (
	tenant     TEXT NOT NULL,
	name       TEXT NOT NULL,
	hosts      TEXT NOT NULL CHECK (json_valid(hosts)),
	header     TEXT NOT NULL,
	format     TEXT NOT NULL,
	ciphertext BLOB NOT NULL,
	created_at TEXT NOT NULL,
	PRIMARY KEY (tenant, name)
) STRICT;
`},
}

// migrate brings the schema up to date in one transaction, so that a crash leaves either the old
// schema or the new one. It refuses a database that a newer binary has migrated further.
func (s *Store) migrate(ctx context.Context, migs []migration) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	applied_at TEXT NOT NULL
) STRICT`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var current sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	have := int(current.Int64)
	if have > len(migs) {
		return fmt.Errorf("database schema version %d is newer than this binary supports (%d): upgrade spaced", have, len(migs))
	}
	for i := have; i < len(migs); i++ {
		m := migs[i]
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return fmt.Errorf("apply migration %d (%s): %w", i+1, m.name, err)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			i+1, m.name, formatTime(time.Now())); err != nil {
			return fmt.Errorf("record migration %d (%s): %w", i+1, m.name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if have < len(migs) {
		s.logger.InfoContext(ctx, "database schema migrated", "from", have, "to", len(migs))
	}
	return nil
}
