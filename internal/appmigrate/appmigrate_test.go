package appmigrate_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/appmigrate"
	"github.com/idemkit/idem/internal/testdb"
)

// An idemd upgrade whose domain migration must lock a table that a long
// transaction writes to (as 004_created_index locks customer_order) gives
// up on the lock after a while, so the application's writes queued behind
// its lock request go on, and it is tried again: once the transaction ends,
// the migration is applied. Before, every write to the table waited for the
// long transaction to end.
func TestPostgresMigrationYieldsToLongTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := testdb.Schema(t, 4)
	v1 := fstest.MapFS{"m/001_item.sql": {Data: []byte("-- older binaries: refuse\n" + `CREATE TABLE item (id bigint PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now())`)}}
	if err := appmigrate.Postgres(ctx, pool, v1, "m", "item_migration", "item-migrate"); err != nil {
		t.Fatal(err)
	}
	v2 := fstest.MapFS{
		"m/001_item.sql":    v1["m/001_item.sql"],
		"m/002_created.sql": {Data: []byte("-- older binaries: accept\n" + `CREATE INDEX item_created_idx ON item (created_at)`)},
	}

	long, err := pool.Begin(ctx) // a long writer (a batch job, a stuck request)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(context.Background()) }()
	if _, err := long.Exec(ctx, `INSERT INTO item (id) VALUES (1)`); err != nil {
		t.Fatal(err)
	}

	migrated := make(chan error, 1)
	go func() { migrated <- appmigrate.Postgres(ctx, pool, v2, "m", "item_migration", "item-migrate") }()
	// Wait until the migration waits for its lock on item.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE NOT granted AND relation = 'item'::regclass)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-migrated:
			t.Fatalf("Migrate returned %v while a transaction held a lock on the table", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the migration never waited for its lock")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The application writes meanwhile: its INSERT must not wait for the
	// long transaction.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := pool.Exec(wctx, `INSERT INTO item (id) VALUES (2)`); err != nil {
		t.Fatalf("a write to the table while the migration waited for its lock: %v after %s (it queued behind the migration's lock request for as long as the long transaction ran)", err, time.Since(start).Round(time.Millisecond))
	}
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-migrated:
		if err != nil {
			t.Fatalf("Migrate once the long transaction ended: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Migrate did not finish once the long transaction ended")
	}
	var idx bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('item_created_idx') IS NOT NULL`).Scan(&idx); err != nil || !idx {
		t.Fatalf("index after Migrate: %v, %v", idx, err)
	}
}

// Replicas starting together on a fresh schema take turns migrating
// idemd's tables, and none fails: also one whose sessions default to
// REPEATABLE READ, whose transaction would otherwise not see what the
// previous holder of the lock committed (it applied 001 again: "relation
// already exists").
func TestPostgresConcurrentMigrators(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, schema := testdb.Schema(t, 2)
	fsys := fstest.MapFS{
		"m/001_item.sql":    {Data: []byte("-- older binaries: refuse\n" + `CREATE TABLE item (id bigint PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now())`)},
		"m/002_created.sql": {Data: []byte("-- older binaries: accept\n" + `CREATE INDEX item_created_idx ON item (created_at)`)},
	}
	const n = 6
	pools := make([]*pgxpool.Pool, n)
	for i := range pools {
		var params map[string]string
		if i%2 == 1 {
			params = map[string]string{"default_transaction_isolation": "repeatable read"}
		}
		pools[i] = testdb.PoolParams(t, schema, 1, params)
	}
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, pool := range pools {
		wg.Go(func() {
			<-start
			errs[i] = appmigrate.Postgres(ctx, pool, fsys, "m", "item_migration", "item-migrate")
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	st, err := appmigrate.PostgresStatus(ctx, pools[0], fsys, "m", "item_migration")
	if err != nil || !st.UpToDate() || st.Current() != 2 {
		t.Fatalf("status after the replicas migrated: %+v, %v", st, err)
	}
}

// An older idemd that read a pending migration, then waited for the
// migration lock while a newer idemd applied it and a version of its own
// that refuses older binaries, refuses the schema once it holds the lock,
// as it does when the newer idemd migrated first. Before, it skipped the
// migration it had read as pending and returned nil: the older idemd
// started on a schema it may not run on.
func TestPostgresRefusesNewerAppliedWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := testdb.Schema(t, 4)
	v1 := fstest.MapFS{"m/001_item.sql": {Data: []byte("-- older binaries: refuse\n" + `CREATE TABLE item (id bigint PRIMARY KEY)`)}}

	newer, err := pool.Begin(ctx) // the newer idemd, holding the migration lock
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = newer.Rollback(context.Background()) }()
	for _, q := range []string{
		`SELECT pg_advisory_xact_lock(hashtext('item-migrate' || ':' || current_schema()))`,
		`CREATE TABLE item_migration (version integer PRIMARY KEY, name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now(), compatible_from integer)`,
		`CREATE TABLE item (id bigint PRIMARY KEY)`,
		`INSERT INTO item_migration (version, name, compatible_from) VALUES (1, 'item', 1), (2, 'newer', 2)`,
	} {
		if _, err := newer.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var holder int
	if err := newer.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
		t.Fatal(err)
	}

	migrated := make(chan error, 1)
	go func() { migrated <- appmigrate.Postgres(ctx, pool, v1, "m", "item_migration", "item-migrate") }()
	testdb.WaitForAdvisoryWaiter(ctx, t, pool, holder, migrated, "migrate")
	if err := newer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-migrated:
		if err == nil || !strings.Contains(err.Error(), "database schema is newer than this binary: version 2") {
			t.Fatalf("migrate after a newer idemd applied a refusing version = %v, want it refused", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("migrate did not return after the lock was released")
	}
}

// idemd's own migrations pending, run by the service's role that may not
// change the schema (idemd migrate up, as the owner, did not run): the
// error says so, besides PostgreSQL's "permission denied for schema".
func TestPostgresPendingWithoutCreatePrivilege(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	owner, schema := testdb.Schema(t, 2)
	v1 := fstest.MapFS{"m/001_item.sql": {Data: []byte("-- older binaries: refuse\n" + `CREATE TABLE item (id bigint PRIMARY KEY)`)}}
	v2 := fstest.MapFS{
		"m/001_item.sql":  v1["m/001_item.sql"],
		"m/002_other.sql": {Data: []byte("-- older binaries: accept\n" + `CREATE TABLE other (id bigint PRIMARY KEY)`)},
	}
	if err := appmigrate.Postgres(ctx, owner, v1, "m", "item_migration", "item-migrate"); err != nil {
		t.Fatal(err)
	}
	app := testdb.DMLPool(t, owner, schema)
	if err := appmigrate.Postgres(ctx, app, v1, "m", "item_migration", "item-migrate"); err != nil {
		t.Fatalf("up to date, as the service's role: %v", err)
	}
	err := appmigrate.Postgres(ctx, app, v2, "m", "item_migration", "item-migrate")
	if err == nil || !strings.Contains(err.Error(), "permission denied for schema") ||
		!strings.Contains(err.Error(), "migrations of item_migration are pending and this role may not run them: run idemd migrate up as the tables' owner first") {
		t.Fatalf("pending, as the service's role: %v; want permission denied, and what to do", err)
	}
}
