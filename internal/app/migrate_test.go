package app_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/testdb"
)

func TestMigrateSubcommandSQLite(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	db := []string{"-db", "sqlite:" + path}

	// status of a missing file: an error, nothing created.
	code, _, stderr := run(t, append([]string{"migrate", "status"}, db...), nil)
	if code != 1 || !strings.HasPrefix(stderr, "idemd migrate status: database sqlite:"+path) {
		t.Fatalf("status of a missing file: code %d, stderr %q", code, stderr)
	}

	// A database with only idem_migration: every migration pending.
	drv, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.DB().Exec(drv.MigrationTableSQL()); err != nil {
		t.Fatal(err)
	}
	ms, err := drv.Migrations()
	_ = drv.Close()
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(t, append([]string{"migrate", "status"}, db...), nil)
	if code != 1 || stderr != "" || strings.Count(idemLines(stdout), " pending\n") != len(ms) || !strings.Contains(stdout, "pending migrations") ||
		!strings.Contains(stdout, "payment_migration: idem: database schema is behind") {
		t.Fatalf("status before up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	code, stdout, stderr = run(t, append([]string{"migrate", "up"}, db...), nil)
	if code != 0 || stderr != "" || strings.Count(stdout, "applied ") != len(ms) || !strings.Contains(stdout, "applied 001_") {
		t.Fatalf("up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = run(t, append([]string{"migrate", "up"}, db...), nil)
	if code != 0 || strings.Contains(stdout, "applied ") {
		t.Fatalf("second up: code %d, stdout %q", code, stdout)
	}

	code, stdout, stderr = run(t, []string{"migrate", "status"}, map[string]string{"IDEMD_DB": path})
	if code != 0 || stderr != "" || strings.Count(idemLines(stdout), " applied\n") != len(ms) || strings.Contains(stdout, " pending\n") {
		t.Fatalf("status after up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// The domain tables exist: idemd starts on the database.
	drv, err = sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drv.Close() }()
	if err := drv.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := drv.DB().QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table'`).Scan(&n); err != nil || n <= len(ms)+1 {
		t.Fatalf("tables after up: %d, %v", n, err)
	}

	// A newer idemd migrated it (idem's tables, then its own): an older
	// one refuses, it does not say "up to date".
	for _, table := range []string{"payment_migration", "idem_migration"} {
		if _, err := drv.DB().Exec(`INSERT INTO ` + table + ` (version, name, applied_at) VALUES (999, 'from_the_future', '2030-01-01T00:00:00Z')`); err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr = run(t, append([]string{"migrate", "up"}, db...), nil)
		if code != 1 || !strings.Contains(stderr, "newer than this binary") {
			t.Fatalf("up on a database with %s version 999: code %d, stdout %q, stderr %q; want exit 1 saying it is newer", table, code, stdout, stderr)
		}
	}
}

// idemLines returns the lines of idemd migrate status's output that are
// about idem's migrations (not idemd's own tables).
func idemLines(stdout string) string {
	var b strings.Builder
	for l := range strings.Lines(stdout) {
		if !strings.Contains(l, "_migration ") {
			b.WriteString(l)
		}
	}
	return b.String()
}

func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	for _, db := range []string{"sqlite:" + testdb.SQLitePath(t), "postgres://nobody@127.0.0.1:1/none"} {
		code, stdout, stderr := run(t, []string{"migrate", "sql", "-db", db}, nil)
		if code != 0 || stderr != "" {
			t.Fatalf("%s: code %d, stderr %q", db, code, stderr)
		}
		if strings.Contains(stdout, "{{") || !strings.Contains(stdout, "-- 001_idempotency_record\n") ||
			!strings.Contains(stdout, "CREATE TABLE IF NOT EXISTS idem_migration") {
			t.Fatalf("%s: stdout %q", db, stdout)
		}
	}
	if !strings.Contains(must(run(t, []string{"migrate", "sql", "-db", "postgres://x@127.0.0.1:1/y"}, nil)), "timestamptz") {
		t.Error("PostgreSQL SQL without timestamptz")
	}
}

func TestMigrateUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		code int
	}{
		{[]string{"migrate"}, 2},
		{[]string{"migrate", "down"}, 2},
		{[]string{"migrate", "status", "-x"}, 2},
		{[]string{"migrate", "status", "extra"}, 2},
		{[]string{"migrate", "sql", "-db", "mongodb://x"}, 2},
		{[]string{"migrate", "-h"}, 0},
		{[]string{"migrate", "up", "-h"}, 0},
	} {
		code, stdout, stderr := run(t, tt.args, nil)
		if code != tt.code {
			t.Errorf("%v: code %d, want %d (stderr %q)", tt.args, code, tt.code, stderr)
		}
		if code == 0 && !strings.HasPrefix(stdout, "usage: idemd migrate") {
			t.Errorf("%v: stdout %q", tt.args, stdout)
		}
		if code != 0 && (strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "idemd")) {
			t.Errorf("%v: stderr %q", tt.args, stderr)
		}
	}
}

func must(_ int, stdout, _ string) string { return stdout }

func TestMigrateSubcommandPostgres(t *testing.T) {
	t.Parallel()
	_, schema := testdb.Schema(t, 2)
	sep := "?"
	if strings.Contains(testdb.DSN(), "?") {
		sep = "&"
	}
	db := []string{"-db", testdb.DSN() + sep + "search_path=" + schema}
	code, stdout, stderr := run(t, append([]string{"migrate", "status"}, db...), nil)
	if code != 1 || stderr != "" || strings.Contains(stdout, " applied\n") || !strings.Contains(stdout, " pending\n") {
		t.Fatalf("status before up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, stderr = run(t, append([]string{"migrate", "up"}, db...), nil)
	if code != 0 || stderr != "" || !strings.Contains(stdout, "applied 001_") {
		t.Fatalf("up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, stderr = run(t, append([]string{"migrate", "status"}, db...), nil)
	if code != 0 || stderr != "" || strings.Contains(stdout, " pending\n") {
		t.Fatalf("status after up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// idemd migrate status answers for every table idemd needs, not only for
// idem's: a deployment step that runs "migrate up" only when status exits 1
// must not skip idemd's pending tables (the start would create them, which
// a role without CREATE rights may not do), nor be told "up to date" on a
// database whose idemd tables a newer idemd migrated (idemd refuses to
// start there).
func TestMigrateStatusCoversIdemdTables(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 2)
	sep := "?"
	if strings.Contains(testdb.DSN(), "?") {
		sep = "&"
	}
	db := []string{"-db", testdb.DSN() + sep + "search_path=" + schema}

	// idem's tables migrated (by the library, or an older idemd), idemd's
	// not yet.
	drv, err := pgdriver.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(t, append([]string{"migrate", "status"}, db...), nil)
	if code != 1 || stderr != "" || !strings.Contains(stdout, "payment_migration") || !strings.Contains(stdout, "order_migration") {
		t.Fatalf("status with idemd's tables pending: code %d, stdout %q, stderr %q; want exit 1 naming payment_migration and order_migration", code, stdout, stderr)
	}

	if code, stdout, stderr = run(t, append([]string{"migrate", "up"}, db...), nil); code != 0 {
		t.Fatalf("up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, stdout, stderr = run(t, append([]string{"migrate", "status"}, db...), nil); code != 0 || strings.Contains(stdout, " pending\n") || !strings.Contains(stdout, "order_migration 4") {
		t.Fatalf("status after up: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// A newer idemd added an orders migration: this one refuses to start,
	// and its status says why.
	if _, err := pool.Exec(ctx, `INSERT INTO order_migration (version, name) VALUES (999, 'from_the_future')`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = run(t, append([]string{"migrate", "status"}, db...), nil)
	if code != 1 || stderr != "" || !strings.Contains(stdout, "order_migration: idem: database schema is newer than this binary: version 999") {
		t.Fatalf("status with order_migration version 999: code %d, stdout %q, stderr %q; want exit 1 saying order_migration is newer", code, stdout, stderr)
	}
}

// The SQL that idemd migrate sql prints, applied as a whole (psql -1 -f,
// or a migration tool given it section by section), leaves a database that
// idem sees migrated: each section records its version. Before, it left
// idem_migration empty, and idemd's start ran 001 again ("relation
// idempotency_record already exists").
func TestMigrateSQLApplied(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 2)
	sep := "?"
	if strings.Contains(testdb.DSN(), "?") {
		sep = "&"
	}
	pgDB := testdb.DSN() + sep + "search_path=" + schema
	sqlitePath := testdb.SQLitePath(t)
	for _, db := range []string{pgDB, "sqlite:" + sqlitePath} {
		code, script, stderr := run(t, []string{"migrate", "sql", "-db", db}, nil)
		if code != 0 || stderr != "" {
			t.Fatalf("%s: migrate sql: code %d, stderr %q", db, code, stderr)
		}
		// Each INSERT records what its migration declares of older
		// binaries (compatible_from), as Migrate does.
		var unmarked int
		if db == pgDB {
			if _, err := pool.Exec(ctx, script); err != nil {
				t.Fatalf("apply the SQL of migrate sql: %v", err)
			}
			err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_migration WHERE compatible_from IS NULL`).Scan(&unmarked)
			if err != nil || unmarked != 0 {
				t.Errorf("%s: %d versions recorded without compatible_from, %v", db, unmarked, err)
			}
		} else {
			drv, err := sqlitedriver.Open(sqlitePath, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = drv.DB().ExecContext(ctx, script)
			if err == nil {
				err = drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM idem_migration WHERE compatible_from IS NULL`).Scan(&unmarked)
			}
			_ = drv.Close()
			if err != nil || unmarked != 0 {
				t.Fatalf("apply the SQL of migrate sql: %v; %d versions recorded without compatible_from", err, unmarked)
			}
		}
		code, stdout, stderr := run(t, []string{"migrate", "up", "-db", db}, nil)
		if code != 0 || strings.Contains(stdout, "applied 0") || !strings.Contains(stdout, "idem's migrations: up to date") {
			t.Errorf("%s: migrate up after applying the SQL of migrate sql: code %d, stdout %q, stderr %q; want idem's migrations up to date", db, code, stdout, stderr)
		}
	}
}
