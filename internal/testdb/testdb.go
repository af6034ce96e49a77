// Package testdb gives tests a private, migrated database: a fresh PostgreSQL
// schema or a fresh SQLite file per test, so tests run in parallel.
//
// PostgreSQL comes from IDEM_TEST_DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable). When it is
// unreachable the test fails: no run passes without having run the
// PostgreSQL tests, unless IDEM_TEST_SKIP_POSTGRES=1 asks to skip them
// (refused under CI=true).
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
)

// DefaultDSN is used when IDEM_TEST_DATABASE_URL is not set.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns the PostgreSQL test database URL.
func DSN() string {
	if v := os.Getenv("IDEM_TEST_DATABASE_URL"); v != "" {
		return v
	}
	return DefaultDSN
}

var (
	reachOnce sync.Once
	reachErr  error
)

// RequirePostgres fails t when PostgreSQL is unreachable: the PostgreSQL
// tests are core tests. IDEM_TEST_SKIP_POSTGRES=1 skips them instead, for a
// quick run on a machine without PostgreSQL; CI never sets it.
func RequirePostgres(t testing.TB) {
	t.Helper()
	reachOnce.Do(func() {
		// A connection slot first, waited for as any connection of the
		// tests waits: with every slot of the machine taken for a while
		// (other test processes, their idemd replicas), 5 s for the slot
		// and the connection together failed every PostgreSQL test of
		// the package as "required", the answer kept for the process.
		release, err := acquireSlot(context.Background())
		if err != nil {
			reachErr = err
			return
		}
		defer release()
		cfg, err := pgx.ParseConfig(DSN())
		if err != nil {
			reachErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.ConnectConfig(ctx, cfg) // on the slot taken above
		if err != nil {
			reachErr = err
			return
		}
		reachErr = conn.Ping(ctx)
		_ = conn.Close(ctx)
	})
	if reachErr != nil {
		if os.Getenv("IDEM_TEST_SKIP_POSTGRES") == "1" && os.Getenv("CI") != "true" {
			t.Skipf("PostgreSQL at %s unreachable, skipped (IDEM_TEST_SKIP_POSTGRES=1): %v", DSN(), reachErr)
		}
		t.Fatalf("PostgreSQL at %s is required (start it, or set IDEM_TEST_DATABASE_URL; IDEM_TEST_SKIP_POSTGRES=1 skips these tests outside CI): %v", DSN(), reachErr)
	}
}

// Schema creates a fresh schema and returns a pool whose search_path is that
// schema, so the test's own tables land there too. Both are dropped when the
// test ends. The schema is created on a session of the pool, which is then
// closed (a caller that reaches the schema through a pool of its own holds
// no idle session of this one), and dropped on one of the pool's idle
// sessions when the test used it (a connection fewer per test).
func Schema(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	pool, schema := schemaPool(t, maxConns)
	pool.Reset()
	return pool, schema
}

// schemaPool is Schema keeping the session that created the schema in the
// pool, for a caller that uses the pool at once (Postgres migrates on it).
func schemaPool(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	RequirePostgres(t)
	schema := "t_" + randHex(6)
	pool := Pool(t, schema, maxConns) // a search_path that does not exist yet is accepted
	onSchema(t, schema, func(ctx context.Context, sql string) error {
		_, err := pool.Exec(ctx, sql)
		return err
	})
	return pool, schema
}

// onSchema creates schema with exec, a session of the pool that the test
// uses, and drops it with exec when the test ends (before the pool closes:
// register the pool's Close first). A test that left the pool's sessions
// unable to drop it (SET ROLE, a read-only or short-timeout session, a
// terminated backend) gets a connection of its own for the DROP. The
// pool's idle sessions hold no lock (pgxpool and database/sql close a
// session released inside a transaction).
func onSchema(t testing.TB, schema string, exec func(ctx context.Context, sql string) error) {
	t.Helper()
	if err := exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		err := exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		if err == nil {
			vacuumCatalogsEvery(ctx, exec)
			return
		}
		c, err := connect(ctx)
		if err != nil {
			return
		}
		_, _ = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		_ = c.Close(ctx)
	})
}

// vacuumPeriod is how many schemas a test process drops between two
// vacuums of the catalogs (vacuumCatalogsEvery).
const vacuumPeriod = 50

// dropped counts the schemas this process dropped.
var dropped atomic.Int64

// churnedCatalogs are the catalogs whose rows each schema's tables,
// indexes, functions and triggers add, and its DROP leaves dead.
const churnedCatalogs = `pg_catalog.pg_attribute, pg_catalog.pg_class, pg_catalog.pg_depend,
	pg_catalog.pg_type, pg_catalog.pg_constraint, pg_catalog.pg_index, pg_catalog.pg_attrdef,
	pg_catalog.pg_trigger, pg_catalog.pg_proc, pg_catalog.pg_namespace, pg_catalog.pg_sequence,
	pg_catalog.pg_description`

// vacuumCatalogsEvery vacuums the catalogs a schema's DROP leaves dead
// rows in, on one of its sessions (exec), once every vacuumPeriod drops of
// this process. The tests create and drop thousands of schemas per run,
// some 300 dead rows of pg_attribute each, and PostgreSQL here (as on CI
// machines) runs without autovacuum: in one run the catalogs grew until
// creating, migrating and dropping a schema cost the server twice the CPU
// (216 ms against 97 ms once vacuumed), and every new session's catalog
// reads slowed with it. A plain VACUUM blocks no one (SKIP_LOCKED: a
// catalog another process is vacuuming is skipped), and a role that may
// not vacuum a catalog gets a warning, not an error; errors are ignored.
func vacuumCatalogsEvery(ctx context.Context, exec func(ctx context.Context, sql string) error) {
	if dropped.Add(1)%vacuumPeriod != 0 {
		return
	}
	_ = exec(ctx, "VACUUM (SKIP_LOCKED) "+churnedCatalogs)
}

// Database creates a fresh database and returns a pool on it, for a test
// whose advisory locks must not reach the other tests (advisory locks are
// per database, whatever the schema). It is dropped when the test ends.
func Database(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	RequirePostgres(t)
	ctx := context.Background()
	name := "idem_t_" + randHex(6)
	admin, err := connect(ctx)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	_ = admin.Close(ctx)
	pool := newPool(t, maxConns, func(cfg *pgxpool.Config) { cfg.ConnConfig.Database = name })
	t.Cleanup(func() {
		pool.Close()
		c, err := connect(context.Background())
		if err != nil {
			return
		}
		_, _ = c.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
		_ = c.Close(context.Background())
	})
	return pool
}

// Pool opens another pool whose search_path is schema (a second "process"
// on the same database). It is closed when the test ends.
func Pool(t testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return PoolParams(t, schema, maxConns, nil)
}

// PoolParams is Pool whose sessions also have the run-time parameters
// params (idle_in_transaction_session_timeout, statement_timeout, ...), as
// a role or database configured by a DBA would give them.
func PoolParams(t testing.TB, schema string, maxConns int32, params map[string]string) *pgxpool.Pool {
	t.Helper()
	return newPool(t, maxConns, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		for k, v := range params {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
	})
}

// newPool opens a pool on DSN, changed by set, closed when the test ends.
func newPool(t testing.TB, maxConns int32, set func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DSN())
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	set(cfg)
	cfg.ConnConfig.DialFunc = dial
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Postgres returns a migrated PostgreSQL driver in a fresh schema
// (migrated by ApplyMigrations: a test of Migrate calls Migrate on a
// driver of its own).
func Postgres(t testing.TB) *pgdriver.Driver {
	t.Helper()
	pool, schema := schemaPool(t, 20)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgdriver: %v", err)
	}
	ApplyMigrations(t, drv, func(ctx context.Context, script string) error {
		_, err := pool.Exec(ctx, script)
		return err
	})
	return drv
}

// SQLitePath returns a path for a fresh SQLite database file.
func SQLitePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "idem.db")
}

// SQLite returns a migrated SQLite driver on a fresh file.
func SQLite(t testing.TB) *sqlitedriver.Driver {
	t.Helper()
	drv, err := sqlitedriver.Open(SQLitePath(t), nil)
	if err != nil {
		t.Fatalf("sqlitedriver: %v", err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	if err := drv.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return drv
}

// Terminate kills the server backend behind tx, as a crash of the client
// between two statements would, and waits (up to 5 s) until it is gone.
func Terminate(t testing.TB, pool *pgxpool.Pool, tx pgx.Tx) {
	t.Helper()
	pid := tx.Conn().PgConn().PID()
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1, 5000)`, int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DMLPool returns a pool (search_path schema) of a new login role that may
// read and write the tables schema holds now but not create anything (the
// application role of a deployment that migrates as the owner). The role
// is dropped when the test ends; owner creates it.
func DMLPool(t testing.TB, owner *pgxpool.Pool, schema string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	role := schema + "_dml"
	for _, s := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + schema + ` TO ` + role,
	} {
		if _, err := owner.Exec(ctx, s); err != nil {
			t.Fatal(s, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.DialFunc = dial
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = owner.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = owner.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	return pool
}

// SchemaOwner makes a new login role the owner of schema, as a DBA gives
// a deployment's migration job its schema (CREATE SCHEMA ... AUTHORIZATION
// role), without CREATE on the database, and returns the role's name. The
// role, and what it owns, are dropped when the test ends.
func SchemaOwner(t testing.TB, schema string) string {
	t.Helper()
	ctx := context.Background()
	role := schema + "_own"
	admin, err := connect(ctx)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer func() { _ = admin.Close(ctx) }()
	for _, s := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`ALTER SCHEMA ` + schema + ` OWNER TO ` + role,
	} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatal(s, err)
		}
	}
	t.Cleanup(func() {
		c, err := connect(context.Background())
		if err != nil {
			return
		}
		_, _ = c.Exec(context.Background(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = c.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = c.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
		_ = c.Close(context.Background())
	})
	return role
}

// RolePool returns a pool of role whose search_path is schema, closed when
// the test ends.
func RolePool(t testing.TB, role, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return newPool(t, maxConns, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.User = role
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	})
}

// SlowCommit creates, with exec (a statement run in the test's schema), a
// table slow_commit whose deferred trigger sleeps 60 s at COMMIT: a
// transaction that inserts a row into it hangs in its COMMIT, as on a
// stalled server or network.
func SlowCommit(t testing.TB, exec func(query string) error) {
	t.Helper()
	for _, q := range []string{
		`CREATE TABLE slow_commit (id int)`,
		`CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON slow_commit DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION slow_commit()`,
	} {
		if err := exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
