package pgdriver_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

func TestDriver(t *testing.T) {
	t.Parallel()
	drivertest.Run(t, drivertest.Backend[pgx.Tx]{
		New: func(t *testing.T) driver.Driver[pgx.Tx] { return testdb.Postgres(t) },
		NewUnmigrated: func(t *testing.T) driver.Driver[pgx.Tx] {
			pool, schema := testdb.Schema(t, 10)
			drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return drv
		},
	})
}

func newDriver(t *testing.T, pool *pgxpool.Pool, cfg *pgdriver.Config) *pgdriver.Driver {
	t.Helper()
	drv, err := pgdriver.New(pool, cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate(%+v): %v", cfg, err)
	}
	return drv
}

func claimParams(key, token string, now time.Time) *driver.RecordClaimParams {
	return &driver.RecordClaimParams{
		Scope:          "tenant-1 POST /payments",
		Key:            key,
		Fingerprint:    []byte("fp"),
		LeaseToken:     token,
		LeaseExpiresAt: now.Add(30 * time.Second),
		Now:            now,
		ExpiresAt:      now.Add(24 * time.Hour),
	}
}

// Config.Schema and Config.TablePrefix put idem's tables, indexes and
// constraints where they are asked to go, and nowhere else; drivers with
// different prefixes share a schema without seeing each other's records.
func TestSchemaAndTablePrefix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, searchPath := testdb.Schema(t, 5)
	schema := searchPath + "_idem" // not on the search_path; Migrate creates it
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })

	app := newDriver(t, pool, &pgdriver.Config{Schema: schema, TablePrefix: "app_"})
	if got, want := app.Table("idempotency_record"), `"`+schema+`".app_idempotency_record`; got != want {
		t.Errorf("Table() = %s, want %s", got, want)
	}

	relations := func() map[string]string {
		rows, err := pool.Query(ctx, `SELECT n.nspname, c.relname FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname IN ($1, $2) AND c.relkind IN ('r', 'i')`, schema, searchPath)
		if err != nil {
			t.Fatalf("list relations: %v", err)
		}
		out := map[string]string{}
		for rows.Next() {
			var ns, rel string
			if err := rows.Scan(&ns, &rel); err != nil {
				t.Fatalf("scan: %v", err)
			}
			out[rel] = ns
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("list relations: %v", err)
		}
		return out
	}
	got := relations()
	for _, rel := range []string{
		"app_idempotency_record",
		"app_idempotency_record_pkey",
		"app_idempotency_record_expires_at_idx",
		"app_idem_migration",
		"app_idem_migration_pkey",
	} {
		if got[rel] != schema {
			t.Errorf("relation %s: in schema %q, want %q", rel, got[rel], schema)
		}
	}
	for rel, ns := range got {
		if ns != schema || !strings.HasPrefix(rel, "app_") {
			t.Errorf("relation %s.%s: every table and index must be in %s and carry the prefix app_", ns, rel, schema)
		}
	}

	other := newDriver(t, pool, &pgdriver.Config{Schema: schema, TablePrefix: "other_"})
	plain := newDriver(t, pool, &pgdriver.Config{Schema: schema})
	now := time.Now()
	for _, d := range []*pgdriver.Driver{app, other, plain} {
		res, err := d.Executor().RecordClaim(ctx, claimParams("key-1", d.Table(""), now))
		if err != nil || !res.Claimed {
			t.Fatalf("claim through %s: %+v, %v; want Claimed", d.Table("idempotency_record"), res, err)
		}
	}
	if err := app.Executor().RecordComplete(ctx, &driver.RecordCompleteParams{
		Scope: "tenant-1 POST /payments", Key: "key-1", LeaseToken: app.Table(""), Status: 201, Body: []byte("app"),
	}); err != nil {
		t.Fatalf("complete through app_: %v", err)
	}
	for _, d := range []*pgdriver.Driver{other, plain} {
		rec, err := d.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "tenant-1 POST /payments", Key: "key-1"})
		if err != nil || rec.State != driver.StateInProgress || rec.LeaseToken != d.Table("") {
			t.Errorf("record through %s: %+v, %v; want its own in-progress claim", d.Table("idempotency_record"), rec, err)
		}
	}

	// The default: tables on the connection's search_path, unprefixed.
	def := newDriver(t, pool, nil)
	if _, err := def.Executor().RecordClaim(ctx, claimParams("key-1", "def", now)); err != nil {
		t.Fatalf("claim with the default config: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+searchPath+".idempotency_record").Scan(&n); err != nil || n != 1 {
		t.Errorf("records in %s.idempotency_record = %d, %v; want 1", searchPath, n, err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	if _, err := pgdriver.New(nil, nil); err == nil {
		t.Error("New(nil pool) succeeded")
	}
	pool, err := pgxpool.New(t.Context(), testdb.DSN()) // connects lazily
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	for _, cfg := range []pgdriver.Config{
		{Schema: "Idem"},
		{Schema: `idem"; DROP TABLE x; --`},
		{TablePrefix: "app-"},
		{TablePrefix: "1app_"},
		{TablePrefix: "a_very_long_prefix_that_goes_on_and_on_and_on_"},
	} {
		if _, err := pgdriver.New(pool, &cfg); err == nil {
			t.Errorf("New(%+v) succeeded; want a validation error", cfg)
		}
	}
	if _, err := pgdriver.New(pool, &pgdriver.Config{Schema: "idem", TablePrefix: "app_"}); err != nil {
		t.Errorf("New with a valid config: %v", err)
	}
}

// Two replicas (two pools) on one schema: among all their concurrent
// duplicates, exactly one claims the key.
func TestTwoPoolsOneClaim(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	poolA, schema := testdb.Schema(t, 10)
	cfg, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.MaxConns = 10
	poolB, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("second pool: %v", err)
	}
	t.Cleanup(poolB.Close)
	// poolB's search_path does not include the schema: the driver must
	// qualify its tables.
	drivers := []*pgdriver.Driver{
		newDriver(t, poolA, &pgdriver.Config{Schema: schema}),
		newDriver(t, poolB, &pgdriver.Config{Schema: schema}),
	}

	const perPool = 50
	for _, key := range []string{"key-1", "key-2", "key-3"} {
		now := time.Now()
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			claimed []string
			errs    []error
		)
		start := make(chan struct{})
		for i := range 2 * perPool {
			d := drivers[i%2]
			token := fmt.Sprintf("pool%d-%s-%d", i%2, key, i)
			wg.Go(func() {
				<-start
				res, err := d.Executor().RecordClaim(ctx, claimParams(key, token, now))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				} else if res.Claimed {
					claimed = append(claimed, token)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("%s: %d claims failed, first: %v", key, len(errs), errs[0])
		}
		if len(claimed) != 1 {
			t.Fatalf("%s: %d of %d concurrent claims from two pools succeeded (first ones: %v); want exactly 1", key, len(claimed), 2*perPool, claimed[:min(len(claimed), 3)])
		}
	}
}

// LockTimeout applies to the claim only: the caller's own lock_timeout in
// its transaction survives, a pooled connection keeps the session default,
// and the server logs no warning per claim.
func TestLockTimeoutLeavesSettingsAlone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, schema := testdb.Schema(t, 1)
	cfg, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.MaxConns = 1 // every statement below uses the same session
	var (
		mu      sync.Mutex
		notices []string
	)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		if n.Severity == "WARNING" {
			notices = append(notices, n.Message)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	drv := newDriver(t, pool, &pgdriver.Config{Schema: schema})
	now := time.Now()

	show := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		t.Helper()
		var v string
		if err := q.QueryRow(ctx, "SHOW lock_timeout").Scan(&v); err != nil {
			t.Fatalf("SHOW lock_timeout: %v", err)
		}
		return v
	}

	p := claimParams("key-1", "a", now)
	p.LockTimeout = 100 * time.Millisecond
	if _, err := drv.Executor().RecordClaim(ctx, p); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if v := show(pool); v != "0" {
		t.Errorf("after a claim with LockTimeout outside a transaction, the session's lock_timeout = %s, want the default 0", v)
	}

	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	defer func() { _ = drv.Rollback(context.Background(), tx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
		t.Fatalf("SET LOCAL: %v", err)
	}
	for _, key := range []string{"key-1", "key-2"} { // existing, then new
		p := claimParams(key, "b", now)
		p.LockTimeout = 100 * time.Millisecond
		if _, err := drv.UnwrapExecutor(tx).RecordClaim(ctx, p); err != nil {
			t.Fatalf("claim %s in tx: %v", key, err)
		}
		if v := show(tx); v != "5s" {
			t.Errorf("after claiming %s with LockTimeout in the caller's transaction, its lock_timeout = %s, want the caller's 5s", key, v)
		}
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(notices) > 0 {
		t.Errorf("server warnings: %q", notices)
	}
}

// Two services with different table prefixes migrating into one new schema
// at the same time.
func TestConcurrentMigrateSharedNewSchema(t *testing.T) {
	t.Parallel()
	pool, base := testdb.Schema(t, 10)
	schema := base + "_shared"
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	const services = 4
	errs := make([]error, services)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range services {
		drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema, TablePrefix: fmt.Sprintf("svc%d_", i)})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		wg.Go(func() {
			<-start
			errs[i] = drv.Migrate(t.Context())
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("service %d: Migrate: %v", i, err)
		}
	}
}

// A recovery loop's List of unfinished sagas reads the index of unfinished
// sagas, not every finished saga of the retention.
func TestSagaListReadsUnfinishedIndex(t *testing.T) {
	t.Parallel()
	drivertest.SagaListReadsUnfinishedIndex[pgx.Tx](t, testdb.Postgres(t), func(ctx context.Context, tx pgx.Tx, sql string, dest ...any) error {
		if len(dest) == 0 {
			_, err := tx.Exec(ctx, sql)
			return err
		}
		return tx.QueryRow(ctx, sql).Scan(dest...)
	})
}
