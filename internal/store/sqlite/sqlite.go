// Package sqlite is the embedded store.Store: one SQLite database file opened with the pure-Go
// modernc.org/sqlite driver (no cgo). It owns the database's schema and its migrations. Only the
// binary that wires the control plane (cmd/spaced) imports it; everything else uses store.Store.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

// busyTimeout is how long a statement waits for another connection's write lock before it fails
// with SQLITE_BUSY. Writes are short, so this is only reached when something is badly wrong.
const busyTimeout = 10 * time.Second

// timeLayout is how times are stored: RFC 3339 in UTC with a fixed nine fractional digits, so
// that the text sorts in time order (time.RFC3339Nano trims trailing zeros and would not) and
// parses back with time.RFC3339Nano.
const timeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// Store is a store.Store backed by one SQLite database file. It is safe for concurrent use.
type Store struct {
	db     *sql.DB
	logger *slog.Logger
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and brings its schema up to date. It
// refuses a database whose schema is newer than this binary knows. The database runs in WAL
// mode with synchronous=FULL, so a write is on disk once the call that made it returns, and
// survives a crash of the process or of the machine.
func Open(ctx context.Context, path string, logger *slog.Logger) (*Store, error) {
	return open(ctx, path, logger, migrations)
}

// open is Open with the migration list as a parameter, so tests can play a later binary.
func open(ctx context.Context, path string, logger *slog.Logger, migs []migration) (*Store, error) {
	if path == "" {
		return nil, errdefs.InvalidArgument("sqlite: empty database path")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		return nil, fmt.Errorf("open sqlite database %s: %w", path, err)
	}
	// Connections live as long as the Store: the pragmas are per connection and a file database
	// gains nothing from reconnecting.
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	db.SetMaxIdleConns(4)
	db.SetMaxOpenConns(16) // SQLite has one writer at a time; more connections only queue

	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite database %s: %w", path, err)
	}
	s := &Store{db: db, logger: logger}
	if err := s.migrate(ctx, migs); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate sqlite database %s: %w", path, err)
	}
	return s, nil
}

// dsn builds the driver's data source name. Every pooled connection runs these pragmas when it
// is made. _txlock=immediate makes every transaction take the write lock at BEGIN, so two
// read-then-write transactions cannot deadlock into SQLITE_BUSY.
func dsn(path string) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	// A file: URI: SQLite decodes percent escapes in the path, and '?' and '#' would end it.
	p := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + p + "?" + q.Encode()
}

// Close closes the database. Calls already in progress finish first.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close sqlite database: %w", err)
	}
	return nil
}

// isUniqueViolation reports whether err is SQLite refusing a duplicate primary key or unique
// column.
func isUniqueViolation(err error) bool {
	var se *msqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
		return true
	case sqlite3.SQLITE_CONSTRAINT:
		// Without extended codes, only the message tells a unique violation from the others.
		return strings.Contains(se.Error(), "UNIQUE constraint failed")
	}
	return false
}

// formatTime renders t for storage; the zero time is stored as "".
func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeLayout)
}

// parseTime reverses formatTime.
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("stored time %q: %w", s, err)
	}
	return t.UTC(), nil
}
