package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

// CreateAPIKey stores k. A key whose ID or hash is already stored is refused with an error
// wrapping errdefs.ErrAlreadyExists.
func (s *Store) CreateAPIKey(ctx context.Context, k store.APIKey) error {
	if k.ID == "" || k.Hash == "" {
		return errdefs.InvalidArgument("api key needs an id and a hash")
	}
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO api_keys (id, hash, tenant, admin, created_at) VALUES (?, ?, ?, ?, ?)`,
		k.ID, k.Hash, k.Tenant, k.Admin, formatTime(k.CreatedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("create api key %s: %w", k.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create api key %s: %w", k.ID, err)
	}
	return nil
}

// APIKeyByHash finds the key whose secret hashes to hash.
func (s *Store) APIKeyByHash(ctx context.Context, hash string) (store.APIKey, error) {
	row := s.db.QueryRowContext(ctx,
		`SELECT id, hash, tenant, admin, created_at FROM api_keys WHERE hash = ?`, hash)
	k, err := scanAPIKey(row)
	if errors.Is(err, sql.ErrNoRows) {
		return store.APIKey{}, fmt.Errorf("api key: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return store.APIKey{}, fmt.Errorf("get api key: %w", err)
	}
	return k, nil
}

// ListAPIKeys returns every key, oldest first.
func (s *Store) ListAPIKeys(ctx context.Context) ([]store.APIKey, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT id, hash, tenant, admin, created_at FROM api_keys ORDER BY created_at, rowid`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	var keys []store.APIKey
	for rows.Next() {
		k, err := scanAPIKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list api keys: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return keys, nil
}

// DeleteAPIKey removes the key with this ID; a missing one is an error wrapping
// errdefs.ErrNotFound.
func (s *Store) DeleteAPIKey(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM api_keys WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete api key %s: %w", id, err)
	}
	return requireOneRow(res, "delete api key", id)
}

// scanner is what *sql.Row and *sql.Rows have in common.
type scanner interface{ Scan(dest ...any) error }

func scanAPIKey(r scanner) (store.APIKey, error) {
	var (
		k       store.APIKey
		created string
	)
	if err := r.Scan(&k.ID, &k.Hash, &k.Tenant, &k.Admin, &created); err != nil {
		return store.APIKey{}, err
	}
	var err error
	if k.CreatedAt, err = parseTime(created); err != nil {
		return store.APIKey{}, err
	}
	return k, nil
}

// sandboxColumns is the column list every sandbox query reads, in scanSandbox's order.
const sandboxColumns = `id, tenant, state, template, runtime, created_at, updated_at, expires_at,
	timeout_seconds, on_timeout, metadata, env, access_token, slot_index, spec, error`

// sandboxRow is a store.Sandbox encoded for its columns.
type sandboxRow struct {
	metadata, env string
	spec          sql.NullString
}

func encodeSandbox(sb store.Sandbox) (sandboxRow, error) {
	var r sandboxRow
	var err error
	if r.metadata, err = encodeMap(sb.Metadata); err != nil {
		return r, fmt.Errorf("metadata: %w", err)
	}
	if r.env, err = encodeMap(sb.Env); err != nil {
		return r, fmt.Errorf("env: %w", err)
	}
	if sb.Spec != nil {
		if !json.Valid(sb.Spec) {
			return r, errdefs.InvalidArgument("sandbox spec is not valid JSON")
		}
		r.spec = sql.NullString{String: string(sb.Spec), Valid: true}
	}
	return r, nil
}

// encodeMap stores a nil map as {} so that the column always holds a JSON object.
func encodeMap(m map[string]string) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// CreateSandbox stores sb. A sandbox whose ID is already stored is refused with an error
// wrapping errdefs.ErrAlreadyExists.
func (s *Store) CreateSandbox(ctx context.Context, sb store.Sandbox) error {
	if sb.ID == "" {
		return errdefs.InvalidArgument("sandbox needs an id")
	}
	r, err := encodeSandbox(sb)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, sb.Tenant, sb.State, sb.Template, sb.Runtime,
		formatTime(sb.CreatedAt), formatTime(sb.UpdatedAt), formatTime(sb.ExpiresAt),
		sb.TimeoutSeconds, sb.OnTimeout, r.metadata, r.env, sb.AccessToken, sb.SlotIndex,
		r.spec, sb.Error)
	if isUniqueViolation(err) {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// UpdateSandbox replaces every field of the stored sandbox sb.ID with sb's.
func (s *Store) UpdateSandbox(ctx context.Context, sb store.Sandbox) error {
	r, err := encodeSandbox(sb)
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET
		tenant = ?, state = ?, template = ?, runtime = ?, created_at = ?, updated_at = ?,
		expires_at = ?, timeout_seconds = ?, on_timeout = ?, metadata = ?, env = ?,
		access_token = ?, slot_index = ?, spec = ?, error = ?
		WHERE id = ?`,
		sb.Tenant, sb.State, sb.Template, sb.Runtime, formatTime(sb.CreatedAt),
		formatTime(sb.UpdatedAt), formatTime(sb.ExpiresAt), sb.TimeoutSeconds, sb.OnTimeout,
		r.metadata, r.env, sb.AccessToken, sb.SlotIndex, r.spec, sb.Error, sb.ID)
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	return requireOneRow(res, "update sandbox", sb.ID)
}

// GetSandbox returns the sandbox id.
func (s *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`, id)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// ListSandboxes returns the sandboxes f selects, oldest first. All of f's metadata pairs must
// match; the filter runs in SQL with json_each, so keys need no escaping.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, error) {
	var (
		where []string
		args  []any
	)
	if f.Tenant != "" {
		where = append(where, "tenant = ?")
		args = append(args, f.Tenant)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+strings.TrimSuffix(strings.Repeat("?, ", len(f.States)), ", ")+")")
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	for k, v := range f.Metadata {
		where = append(where, `EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m
			WHERE m.key = ? AND m.type = 'text' AND m.value = ?)`)
		args = append(args, k, v)
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY created_at, rowid`

	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []store.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// DeleteSandbox removes the sandbox id.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return requireOneRow(res, "delete sandbox", id)
}

func requireOneRow(res sql.Result, op, id string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, id, err)
	}
	if n == 0 {
		return fmt.Errorf("%s %s: %w", op, id, errdefs.ErrNotFound)
	}
	return nil
}

func scanSandbox(r scanner) (store.Sandbox, error) {
	var (
		sb                        store.Sandbox
		created, updated, expires string
		metadata, env             string
		spec                      sql.NullString
	)
	if err := r.Scan(&sb.ID, &sb.Tenant, &sb.State, &sb.Template, &sb.Runtime,
		&created, &updated, &expires, &sb.TimeoutSeconds, &sb.OnTimeout, &metadata, &env,
		&sb.AccessToken, &sb.SlotIndex, &spec, &sb.Error); err != nil {
		return store.Sandbox{}, err
	}
	var err error
	if sb.CreatedAt, err = parseTime(created); err != nil {
		return store.Sandbox{}, err
	}
	if sb.UpdatedAt, err = parseTime(updated); err != nil {
		return store.Sandbox{}, err
	}
	if sb.ExpiresAt, err = parseTime(expires); err != nil {
		return store.Sandbox{}, err
	}
	if err := json.Unmarshal([]byte(metadata), &sb.Metadata); err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &sb.Env); err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s env: %w", sb.ID, err)
	}
	if spec.Valid {
		sb.Spec = json.RawMessage(spec.String)
	}
	return sb, nil
}
