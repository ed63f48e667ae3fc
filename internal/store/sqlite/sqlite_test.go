package sqlite

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "space.db"), nil)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

func TestReopenKeepsData(t *testing.T) {
	ctx := context.Background()
	// Characters that mean something in a URI must not change which file is opened.
	path := filepath.Join(t.TempDir(), "dir with space?#%20", "space.db")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, path, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	created := time.Date(2026, 5, 1, 10, 0, 0, 123, time.UTC)
	if err := s.CreateSandbox(ctx, store.Sandbox{ID: "sbx_1", Tenant: "t", State: "running", CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database file not at the path given: %v", err)
	}

	for i := range 2 { // twice: reopening an up-to-date database is a no-op
		s, err = Open(ctx, path, nil)
		if err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		got, err := s.GetSandbox(ctx, "sbx_1")
		if err != nil {
			t.Fatalf("reopen %d: GetSandbox: %v", i, err)
		}
		if got.State != "running" || !got.CreatedAt.Equal(created) {
			t.Errorf("reopen %d: got %+v", i, got)
		}
		if v := schemaVersion(t, s); v != len(migrations) {
			t.Errorf("reopen %d: schema version %d, want %d", i, v, len(migrations))
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPragmas(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "space.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Hold several connections at once, so the check covers more than the first one.
	ctx := context.Background()
	var conns []*sql.Conn
	for range 3 {
		c, err := s.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		for _, p := range []struct{ pragma, want string }{
			{"journal_mode", "wal"},
			{"synchronous", "2"}, // FULL
			{"foreign_keys", "1"},
			{"busy_timeout", "10000"},
		} {
			var got string
			if err := c.QueryRowContext(ctx, "PRAGMA "+p.pragma).Scan(&got); err != nil {
				t.Fatalf("conn %d: PRAGMA %s: %v", i, p.pragma, err)
			}
			if got != p.want {
				t.Errorf("conn %d: PRAGMA %s = %q, want %q", i, p.pragma, got, p.want)
			}
		}
		c.Close()
	}
}

func TestMigrations(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "space.db")
	s, err := Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, store.Sandbox{ID: "sbx_old", State: "running"}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// A later binary adds a step; opening with it applies only that step and keeps the data.
	later := append(append([]migration(nil), migrations...), migration{
		name: "add notes",
		sql:  `ALTER TABLE sandboxes ADD COLUMN notes TEXT NOT NULL DEFAULT 'none'`,
	})
	s, err = open(ctx, path, nil, later)
	if err != nil {
		t.Fatalf("open with a new migration: %v", err)
	}
	if v := schemaVersion(t, s); v != len(later) {
		t.Errorf("schema version %d, want %d", v, len(later))
	}
	var notes string
	if err := s.db.QueryRowContext(ctx, `SELECT notes FROM sandboxes WHERE id = 'sbx_old'`).Scan(&notes); err != nil {
		t.Fatalf("new column: %v", err)
	}
	if notes != "none" {
		t.Errorf("notes = %q, want the default", notes)
	}
	if _, err := s.GetSandbox(ctx, "sbx_old"); err != nil {
		t.Errorf("old record after migration: %v", err)
	}
	s.Close()

	// This binary must refuse the database the later one left, and say why.
	_, err = Open(ctx, path, nil)
	if err == nil {
		t.Fatal("Open of a newer schema succeeded")
	}
	if !strings.Contains(err.Error(), "newer than this binary supports") {
		t.Errorf("Open of a newer schema: %v, want a clear error", err)
	}
}

func TestFailedMigrationRollsBack(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "space.db")
	bad := append(append([]migration(nil), migrations...), migration{
		name: "broken",
		sql:  `CREATE TABLE half (x INTEGER); THIS IS NOT SQL`,
	})
	if _, err := open(ctx, path, nil, bad); err == nil {
		t.Fatal("open with a broken migration succeeded")
	}
	s, err := Open(ctx, path, nil)
	if err != nil {
		t.Fatalf("Open after a failed migration: %v", err)
	}
	defer s.Close()
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE name = 'half'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Error("a failed migration left its table behind")
	}
}

func TestInvalidInput(t *testing.T) {
	ctx := context.Background()
	if _, err := Open(ctx, "", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Open(\"\") = %v, want ErrInvalidArgument", err)
	}
	s, err := Open(ctx, filepath.Join(t.TempDir(), "space.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tests := []struct {
		name string
		err  error
	}{
		{"spec not JSON", s.CreateSandbox(ctx, store.Sandbox{ID: "sbx_x", Spec: []byte("{nope")})},
		{"sandbox without id", s.CreateSandbox(ctx, store.Sandbox{})},
		{"key without hash", s.CreateAPIKey(ctx, store.APIKey{ID: "k"})},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tt.name, tt.err)
		}
	}
}

func schemaVersion(t *testing.T, s *Store) int {
	t.Helper()
	var v int
	if err := s.db.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestAcknowledgedWritesSurviveKill runs a writer in a child process, kills it with SIGKILL in
// the middle of its writes, and checks that every write it had acknowledged is in the database.
func TestAcknowledgedWritesSurviveKill(t *testing.T) {
	if path := os.Getenv("SPACE_SQLITE_KILL_WRITER"); path != "" {
		killWriter(path)
		return
	}
	path := filepath.Join(t.TempDir(), "space.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestAcknowledgedWritesSurviveKill$")
	cmd.Env = append(os.Environ(), "SPACE_SQLITE_KILL_WRITER="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var acked []string
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
			acked = append(acked, id)
		}
		if len(acked) == 200 {
			cmd.Process.Kill() // SIGKILL, in the middle of the next writes
			break
		}
	}
	for sc.Scan() { // acknowledgements already in the pipe count too
		if id, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
			acked = append(acked, id)
		}
	}
	cmd.Wait() //nolint:errcheck // killed on purpose
	if len(acked) < 200 {
		t.Fatalf("writer acknowledged only %d writes before it ended", len(acked))
	}

	s, err := Open(context.Background(), path, nil)
	if err != nil {
		t.Fatalf("Open after kill: %v", err)
	}
	defer s.Close()
	for _, id := range acked {
		if _, err := s.GetSandbox(context.Background(), id); err != nil {
			t.Errorf("acknowledged write %s lost: %v", id, err)
		}
	}
}

// killWriter is the child of TestAcknowledgedWritesSurviveKill: it writes until it is killed.
func killWriter(path string) {
	ctx := context.Background()
	s, err := Open(ctx, path, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for i := 0; ; i++ {
		id := fmt.Sprintf("sbx_%d", i)
		if err := s.CreateSandbox(ctx, store.Sandbox{ID: id, State: "running", CreatedAt: time.Now()}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("acked %s\n", id)
	}
}
