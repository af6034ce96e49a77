package testdb

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver/pgsqldriver"
)

// SQLDB creates a fresh schema and returns a database/sql pool on it,
// through the pgx stdlib driver, whose search_path is that schema. Both are
// dropped or closed when the test ends. The schema is created and dropped
// on the pool's sessions (see Schema).
func SQLDB(t testing.TB, maxConns int) (*sql.DB, string) {
	t.Helper()
	RequirePostgres(t)
	schema := "t_" + randHex(6)
	db := SQLPool(t, schema, maxConns) // a search_path that does not exist yet is accepted
	onSchema(t, schema, func(ctx context.Context, sql string) error {
		_, err := db.ExecContext(ctx, sql)
		return err
	})
	return db, schema
}

// SQLPool opens another database/sql pool whose search_path is schema (a
// second "process" on the same database). It is closed when the test ends,
// before the schema is dropped (cleanups run last first).
func SQLPool(t testing.TB, schema string, maxConns int) *sql.DB {
	t.Helper()
	return SQLPoolParams(t, schema, maxConns, nil)
}

// SQLPoolParams is SQLPool whose sessions also have the run-time
// parameters params (default_transaction_isolation, ...).
func SQLPoolParams(t testing.TB, schema string, maxConns int, params map[string]string) *sql.DB {
	t.Helper()
	cfg, err := connConfig()
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.RuntimeParams["search_path"] = schema
	for k, v := range params {
		cfg.RuntimeParams[k] = v
	}
	db := stdlib.OpenDB(*cfg)
	if maxConns > 0 {
		db.SetMaxOpenConns(maxConns)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// RoleSQLPool is SQLPool as role.
func RoleSQLPool(t testing.TB, role, schema string, maxConns int) *sql.DB {
	t.Helper()
	cfg, err := connConfig()
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.User = role
	cfg.RuntimeParams["search_path"] = schema
	db := stdlib.OpenDB(*cfg)
	if maxConns > 0 {
		db.SetMaxOpenConns(maxConns)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// PostgresSQL returns a migrated pgsqldriver (PostgreSQL over database/sql)
// in a fresh schema (migrated by ApplyMigrations, as Postgres).
func PostgresSQL(t testing.TB) *pgsqldriver.Driver {
	t.Helper()
	drv, _ := PostgresSQLSchema(t)
	return drv
}

// PostgresSQLSchema is PostgresSQL, also returning the schema.
func PostgresSQLSchema(t testing.TB) (*pgsqldriver.Driver, string) {
	t.Helper()
	db, schema := SQLDB(t, 24) // 20 concurrent transactions and some
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgsqldriver: %v", err)
	}
	ApplyMigrations(t, drv, func(ctx context.Context, script string) error {
		_, err := db.ExecContext(ctx, script)
		return err
	})
	return drv, schema
}

// TerminateSQL kills the server backend behind tx, as Terminate does for a
// pgx.Tx, and waits (up to 5 s) until it is gone.
func TerminateSQL(t testing.TB, db *sql.DB, tx *sql.Tx) {
	t.Helper()
	var pid int
	if err := tx.QueryRowContext(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatalf("pg_backend_pid: %v", err)
	}
	var ok bool
	if err := db.QueryRowContext(context.Background(), `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
}

// Strings runs query on db and returns the first column of its rows.
func Strings(t testing.TB, db *sql.DB, query string, args ...any) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer func() { _ = rows.Close() }()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return out
}
