package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

const snapshotCols = `id, tenant, sandbox_id, kind, label, parent_id, created_at, size_bytes, stored_bytes`

// CreateSnapshot stores sn; an existing ID is refused with errdefs.ErrAlreadyExists.
func (s *Store) CreateSnapshot(ctx context.Context, sn store.Snapshot) error {
	if sn.ID == "" || sn.SandboxID == "" {
		return errdefs.InvalidArgument("snapshot needs an id and a sandbox id")
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.Tenant, sn.SandboxID, sn.Kind, sn.Label, sn.ParentID, formatTime(sn.CreatedAt), sn.SizeBytes, sn.StoredBytes)
	if isUniqueViolation(err) {
		return fmt.Errorf("create snapshot %s: %w", sn.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create snapshot %s: %w", sn.ID, err)
	}
	return nil
}

// GetSnapshot returns the snapshot with ID id.
func (s *Store) GetSnapshot(ctx context.Context, id string) (store.Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return sn, nil
}

// ListSnapshots returns the snapshots f selects, oldest first.
func (s *Store) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]store.Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots WHERE 1=1`
	var args []any
	if f.Tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, f.Tenant)
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, f.SandboxID)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, rowid`, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []store.Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		out = append(out, sn)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// DeleteSnapshot removes the record of snapshot id.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return requireOneRow(res, "delete snapshot", id)
}

func scanSnapshot(r scanner) (store.Snapshot, error) {
	var (
		sn      store.Snapshot
		created string
	)
	if err := r.Scan(&sn.ID, &sn.Tenant, &sn.SandboxID, &sn.Kind, &sn.Label, &sn.ParentID, &created, &sn.SizeBytes, &sn.StoredBytes); err != nil {
		return store.Snapshot{}, err
	}
	t, err := parseTime(created)
	if err != nil {
		return store.Snapshot{}, err
	}
	sn.CreatedAt = t
	return sn, nil
}
