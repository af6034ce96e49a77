package app_test

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// A rolling deploy, or a rollback of the binary: a newer idemd migrated
// the database (idem's tables and idemd's own) and this one starts on it.
// It starts when every version it does not know records that it accepts
// this binary, with a WARN naming them per table, and migrate status says
// so and exits 0; it refuses (exit 1, "newer than this binary") when one
// does not. Before, it refused any newer version, however harmless. A
// migration table created before compatible_from still works, and gets the
// column when a migration is applied to it.
func TestStartOnNewerSchema(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dbArg, exec, _ := rawDB(t, kind)
			start := func() string {
				t.Helper()
				cfg, err := app.ParseConfig([]string{"-db", dbArg, "-kafka", "off"}, func(string) string { return "" })
				if err != nil {
					t.Fatal(err)
				}
				logs := &testlog.Buffer{}
				a, err := app.New(ctx, cfg, newTestLogger(logs))
				if err != nil {
					t.Fatalf("app.New: %v\n%s", err, logs)
				}
				a.Close()
				return logs.String()
			}
			start() // migrates

			// The newer idemd added one migration to each table, each
			// recorded as accepting older binaries.
			for _, table := range []string{"idem_migration", "payment_migration", "order_migration"} {
				exec(`INSERT INTO ` + table + ` (version, name, applied_at, compatible_from) VALUES (901, 'from_a_newer_idemd', ` + appliedAt(kind, table) + `, 1)`)
			}
			exec(`INSERT INTO order_migration (version, name, applied_at, compatible_from) VALUES (902, 'from_a_newer_idemd', ` + appliedAt(kind, "") + `, 4)`)
			logs := start()
			for _, want := range []string{`"table":"idem_migration","versions":"901"`, `"table":"payment_migration","versions":"901"`,
				`"table":"order_migration","versions":"901, 902"`} {
				if !strings.Contains(logs, `"level":"WARN","msg":"database schema is newer than this binary; its newer migrations accept this binary`) ||
					!strings.Contains(logs, want) {
					t.Errorf("start on the newer schema: no WARN with %s:\n%s", want, logs)
				}
			}
			code, stdout, stderr := run(t, []string{"migrate", "status", "-db", dbArg}, nil)
			if code != 0 || stderr != "" || !strings.Contains(stdout, "901 ?                            older binaries: accept") ||
				!strings.Contains(stdout, "902 order_migration ?            older binaries: accept from 4") ||
				!strings.Contains(stdout, "newer than this binary, which its newer migrations accept: idem_migration 901, payment_migration 901, order_migration 901, 902") ||
				!strings.Contains(stdout, "001 idempotency_record           older binaries: refuse") {
				t.Fatalf("migrate status: code %d, stdout:\n%s\nstderr %q; want exit 0 showing the markers", code, stdout, stderr)
			}
			if code, stdout, stderr := run(t, []string{"migrate", "up", "-db", dbArg}, nil); code != 0 {
				t.Fatalf("migrate up: code %d, stdout %q, stderr %q; want 0, nothing to apply", code, stdout, stderr)
			}

			// One more that refuses older binaries: this one is refused.
			exec(`INSERT INTO payment_migration (version, name, applied_at, compatible_from) VALUES (903, 'from_a_newer_idemd', ` + appliedAt(kind, "") + `, 903)`)
			code, stdout, stderr = run(t, []string{"-addr", "127.0.0.1:0", "-db", dbArg, "-kafka", "off"}, nil)
			want := "payment_migration: idem: database schema is newer than this binary: version 901, 903"
			if code != 1 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "recorded as needing a binary that knows version 903 or later") {
				t.Fatalf("start: code %d, stdout %q, stderr %q; want exit 1, %q", code, stdout, stderr, want)
			}
			code, stdout, _ = run(t, []string{"migrate", "status", "-db", dbArg}, nil)
			if code != 1 || !strings.Contains(stdout, "903 payment_migration ?          older binaries: refuse") {
				t.Fatalf("migrate status: code %d, stdout:\n%s; want exit 1", code, stdout)
			}
		})
	}
}

// idemd's own migration tables as an earlier idemd created them, without
// compatible_from: this one starts on them, applies what is pending, adds
// the column, and records what the migration declares.
func TestStartOnOldMigrationTables(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dbArg, exec, db := rawDB(t, kind)
			if code, stdout, stderr := run(t, []string{"migrate", "up", "-db", dbArg}, nil); code != 0 {
				t.Fatalf("migrate up: code %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			exec(`ALTER TABLE payment_migration DROP COLUMN compatible_from`)
			exec(`ALTER TABLE order_migration DROP COLUMN compatible_from`)
			exec(`DELETE FROM order_migration WHERE version = 4`)
			exec(`DROP INDEX customer_order_created_idx`)
			cfg, err := app.ParseConfig([]string{"-db", dbArg, "-kafka", "off"}, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			logs := &testlog.Buffer{}
			a, err := app.New(ctx, cfg, newTestLogger(logs))
			if err != nil {
				t.Fatalf("app.New on the old tables: %v", err)
			}
			a.Close()
			if strings.Contains(logs.String(), "newer") {
				t.Errorf("logs: %s", logs)
			}
			// The column is there again, 004 recorded as accepting.
			var from sql.NullInt64
			if err := db.QueryRowContext(ctx, `SELECT compatible_from FROM order_migration WHERE version = 4`).Scan(&from); err != nil || from.Int64 != 1 {
				t.Fatalf("order_migration 004: compatible_from %v, %v; want 1 (accept)", from, err)
			}
			if code, stdout, _ := run(t, []string{"migrate", "status", "-db", dbArg}, nil); code != 0 {
				t.Fatalf("migrate status: code %d, stdout:\n%s", code, stdout)
			}
			// A newer version on the old payment table has no marker:
			// refused.
			exec(`INSERT INTO payment_migration (version, name) VALUES (901, 'from_a_newer_idemd')`)
			code, stdout, stderr := run(t, []string{"-addr", "127.0.0.1:0", "-db", dbArg, "-kafka", "off"}, nil)
			if code != 1 || !strings.Contains(stderr, "payment_migration: idem: database schema is newer than this binary: version 901") {
				t.Fatalf("start: code %d, stdout %q, stderr %q; want exit 1", code, stdout, stderr)
			}
		})
	}
}

// appliedAt is a value for the applied_at column of table.
func appliedAt(kind, table string) string {
	switch {
	case kind == app.Postgres:
		return "now()"
	case table == "idem_migration":
		return "0"
	}
	return "'2030-01-01T00:00:00Z'"
}

// rawDB returns a -db value for a fresh database of kind, a function
// that runs a statement on it, and the database.
func rawDB(t *testing.T, kind string) (string, func(query string), *sql.DB) {
	t.Helper()
	var db *sql.DB
	var dbArg string
	if kind == app.Postgres {
		var schema string
		db, schema = testdb.SQLDB(t, 2)
		u, err := url.Parse(testdb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		dbArg = u.String()
	} else {
		path := testdb.SQLitePath(t)
		var err error
		if db, err = sql.Open("sqlite", sqlitedriver.DSN(path, 0)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		dbArg = "sqlite:" + path
	}
	return dbArg, func(query string) {
		t.Helper()
		if _, err := db.ExecContext(context.Background(), query); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}, db
}
