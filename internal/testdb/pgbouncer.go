package testdb

import (
	"context"
	"database/sql"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/pgbouncer"
)

// bouncerServerConns is the most PostgreSQL connections one PgBouncer of
// the tests opens (max_db_connections); PgBouncer takes that many of the
// tests' connection slots (acquireSlot) for as long as it runs, so that it
// never pushes the machine's tests past the server's max_connections.
const bouncerServerConns = 12

// PgBouncer starts a PgBouncer in transaction pooling mode (pool_mode =
// transaction: a client holds a server connection only for the duration
// of a transaction, or of one statement outside a transaction) in front of
// the test database, and returns its URL. It stops when the test ends.
//
// PgBouncer must be installed (Debian: apt-get install pgbouncer). Without
// it the test fails under CI=true and is skipped otherwise, so that the
// README's test command still runs on a machine that lacks it; .ci/run
// installs it.
func PgBouncer(t testing.TB) string {
	t.Helper()
	RequirePostgres(t)
	if _, err := pgbouncer.Lookup(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgbouncer is required under CI: %v", err)
		}
		t.Skipf("skipped (CI requires it): %v", err)
	}
	release, err := ReserveConns(context.Background(), bouncerServerConns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release) // after the process is gone (cleanups run last first)
	p, err := pgbouncer.Start(context.Background(), pgbouncer.Config{DSN: DSN(), PoolSize: bouncerServerConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", p.Log())
		}
	})
	return p.URL
}

// BouncerPool opens a pool through the PgBouncer at bouncerURL (from
// PgBouncer). Its statements are not prepared by name
// (QueryExecModeCacheDescribe): PgBouncer before 1.21 does not keep a
// prepared statement across a client's transactions. It is closed when
// the test ends.
func BouncerPool(t testing.TB, bouncerURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(bouncerURL)
	if err != nil {
		t.Fatalf("parse pgbouncer url: %v", err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PostgresBehindPgBouncer returns a migrated pgdriver on a fresh schema,
// and the schema, whose pool goes through the PgBouncer at bouncerURL (the
// schema is migrated by ApplyMigrations on a direct connection). The
// schema is named
// in pgdriver.Config.Schema: a search_path given at connection start is
// not passed on by PgBouncer.
func PostgresBehindPgBouncer(t testing.TB, bouncerURL string, cfg *pgdriver.Config) (*pgdriver.Driver, string) {
	t.Helper()
	direct, schema := Schema(t, 2)
	c := pgdriver.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	drv, err := pgdriver.New(BouncerPool(t, bouncerURL, 10), &c)
	if err != nil {
		t.Fatalf("pgdriver: %v", err)
	}
	ApplyMigrations(t, drv, func(ctx context.Context, script string) error {
		_, err := direct.Exec(ctx, script)
		return err
	})
	direct.Reset() // the test goes through PgBouncer: hold no direct session
	return drv, schema
}

// BouncerSQLDB is BouncerPool for database/sql: a pool of pgx's stdlib
// through the PgBouncer at bouncerURL, its statements not prepared by name.
// It is closed when the test ends.
func BouncerSQLDB(t testing.TB, bouncerURL string, maxConns int) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(bouncerURL)
	if err != nil {
		t.Fatalf("parse pgbouncer url: %v", err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// PostgresSQLBehindPgBouncer is PostgresBehindPgBouncer for pgsqldriver
// (over BouncerSQLDB).
func PostgresSQLBehindPgBouncer(t testing.TB, bouncerURL string) (*pgsqldriver.Driver, string) {
	t.Helper()
	direct, schema := Schema(t, 2)
	drv, err := pgsqldriver.New(BouncerSQLDB(t, bouncerURL, 24), &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgsqldriver: %v", err)
	}
	ApplyMigrations(t, drv, func(ctx context.Context, script string) error {
		_, err := direct.Exec(ctx, script)
		return err
	})
	direct.Reset() // the test goes through PgBouncer: hold no direct session
	return drv, schema
}

// Churn runs other clients' short transactions through pool (one through
// PgBouncer) from 4 goroutines, so that PgBouncer moves a client's
// statements outside a transaction between its server connections, as on
// a busy service. It stops when stop is called or the test ends.
func Churn(t testing.TB, pool *pgxpool.Pool) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				_, _ = pool.Exec(context.Background(), "SELECT pg_sleep(0.001)")
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}
