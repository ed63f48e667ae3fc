package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

// PutSecret creates or replaces a secret.
func (s *Store) PutSecret(ctx context.Context, sec store.Secret) error {
	if sec.Name == "" || len(sec.Ciphertext) == 0 {
		return errdefs.InvalidArgument("secret needs a name and a sealed value")
	}
	hosts, err := json.Marshal(sec.Hosts)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO secrets (tenant, name, hosts, header, format, ciphertext, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (tenant, name) DO UPDATE SET hosts = excluded.hosts, header = excluded.header,
			format = excluded.format, ciphertext = excluded.ciphertext, created_at = excluded.created_at`,
		sec.Tenant, sec.Name, string(hosts), sec.Header, sec.Format, sec.Ciphertext, formatTime(sec.CreatedAt))
	if err != nil {
		return fmt.Errorf("put secret %s: %w", sec.Name, err)
	}
	return nil
}

const secretCols = `tenant, name, hosts, header, format, ciphertext, created_at`

// GetSecret returns the secret (tenant, name).
func (s *Store) GetSecret(ctx context.Context, tenant, name string) (store.Secret, error) {
	sec, err := scanSecret(s.db.QueryRowContext(ctx, `SELECT `+secretCols+` FROM secrets WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Secret{}, fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Secret{}, fmt.Errorf("get secret %s: %w", name, err)
	}
	return sec, nil
}

// ListSecrets returns a tenant's secrets by name.
func (s *Store) ListSecrets(ctx context.Context, tenant string) ([]store.Secret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+secretCols+` FROM secrets WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	defer rows.Close()
	var out []store.Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		out = append(out, sec)
	}
	return out, rows.Err()
}

// DeleteSecret removes the secret (tenant, name).
func (s *Store) DeleteSecret(ctx context.Context, tenant, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ? AND name = ?`, tenant, name)
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, err)
	}
	return requireOneRow(res, "delete secret", name)
}

func scanSecret(r scanner) (store.Secret, error) {
	var (
		sec            store.Secret
		hosts, created string
	)
	if err := r.Scan(&sec.Tenant, &sec.Name, &hosts, &sec.Header, &sec.Format, &sec.Ciphertext, &created); err != nil {
		return store.Secret{}, err
	}
	if err := json.Unmarshal([]byte(hosts), &sec.Hosts); err != nil {
		return store.Secret{}, err
	}
	t, err := parseTime(created)
	if err != nil {
		return store.Secret{}, err
	}
	sec.CreatedAt = t
	return sec, nil
}
