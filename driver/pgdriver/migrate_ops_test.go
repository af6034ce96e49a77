package pgdriver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// A binary older than the schema (a rollback after a newer one migrated)
// refuses to migrate it, instead of starting and failing at a request.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 4)
	drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema})
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+drv.Table("idem_migration")+` (version, name) VALUES (999, 'from_the_future')`); err != nil {
		t.Fatal(err)
	}
	err := drv.Migrate(ctx)
	if err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("Migrate on a schema with version 999: %v; want an error saying it is newer", err)
	}
}

// A service whose role may read and write idem's tables but not create
// anything (the schema migrated by a deployment step) starts: Migrate and
// MigrateTx on an up-to-date schema run no DDL.
func TestMigrateUpToDateWithoutCreatePrivilege(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 4)
	if err := newBareDriver(t, pool, &pgdriver.Config{Schema: schema}).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	app := testdb.DMLPool(t, pool, schema)
	for _, c := range []*pgdriver.Config{{Schema: schema}, {}} {
		drv := newBareDriver(t, app, c)
		if err := drv.Migrate(ctx); err != nil {
			t.Errorf("Migrate (Schema %q) without CREATE rights on an up-to-date schema: %v", c.Schema, err)
		}
		// And in the service's own transaction (with its own
		// migrations, say).
		if err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error { return drv.MigrateTx(ctx, tx) }); err != nil {
			t.Errorf("MigrateTx (Schema %q) without CREATE rights on an up-to-date schema: %v", c.Schema, err)
		}
	}
}

// A deployment's migration job runs as the owner of the schema a DBA
// created for it (CREATE SCHEMA idem AUTHORIZATION deploy), a role that may
// create tables there but not schemas in the database. Migrate naming that
// schema, and the rendered SQL of MigrationTableSQL and Migrations applied
// by another tool, both migrate it: the schema exists, so neither needs
// CREATE on the database.
func TestMigrateAsSchemaOwner(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, how := range []string{"Migrate", "rendered SQL"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			_, schema := testdb.Schema(t, 1)
			owner := testdb.RolePool(t, testdb.SchemaOwner(t, schema), schema, 2)
			drv := newBareDriver(t, owner, &pgdriver.Config{Schema: schema})
			if how == "Migrate" {
				if err := drv.Migrate(ctx); err != nil {
					t.Fatalf("Migrate as the schema's owner: %v", err)
				}
			} else {
				ms, err := drv.Migrations()
				if err != nil {
					t.Fatal(err)
				}
				err = pgx.BeginFunc(ctx, owner, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, drv.MigrationTableSQL()); err != nil {
						return fmt.Errorf("MigrationTableSQL: %w", err)
					}
					for _, m := range ms {
						if _, err := tx.Exec(ctx, m.SQL); err != nil {
							return fmt.Errorf("migration %d: %w", m.Version, err)
						}
						if _, err := tx.Exec(ctx, `INSERT INTO `+drv.Table("idem_migration")+` (version, name, compatible_from) VALUES ($1, $2, $3)`,
							m.Version, m.Name, m.CompatibleFrom); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Fatalf("rendered SQL as the schema's owner: %v", err)
				}
			}
			if err := drv.Validate(ctx); err != nil {
				t.Errorf("Validate after migrating as the schema's owner: %v", err)
			}
		})
	}
}

// MigrationTableSQL creates a missing schema, and leaves an existing one
// alone; so does Migrate.
func TestMigrationTableSQLCreatesSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 1)
	fresh := schema + "_new"
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{fresh}.Sanitize()+` CASCADE`)
	})
	drv := newBareDriver(t, pool, &pgdriver.Config{Schema: fresh})
	for i := range 2 {
		if _, err := pool.Exec(ctx, drv.MigrationTableSQL()); err != nil {
			t.Fatalf("MigrationTableSQL, run %d: %v", i+1, err)
		}
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if err := drv.Validate(ctx); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	other := schema + "_new2"
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+other+` CASCADE`)
	})
	drv = newBareDriver(t, pool, &pgdriver.Config{Schema: other})
	if err := drv.Migrate(ctx); err != nil {
		t.Fatalf("Migrate, schema missing: %v", err)
	}
	if err := drv.Validate(ctx); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

// Replicas that name the schema and replicas that reach it through their
// search_path share the migration lock; and replicas whose sessions default
// to REPEATABLE READ still see what the previous holder committed. Six
// replicas migrating a fresh schema at once all succeed.
func TestConcurrentMigrateMixedReplicas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, schema := testdb.Schema(t, 2)
	rr, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	rr.ConnConfig.RuntimeParams["search_path"] = schema
	rr.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	rrPool, err := pgxpool.NewWithConfig(ctx, rr)
	if err != nil {
		t.Fatal(err)
	}
	defer rrPool.Close()
	var drivers []*pgdriver.Driver
	for i := range 6 {
		pool := testdb.Pool(t, schema, 2)
		if i == 5 {
			pool = rrPool
		}
		cfg := &pgdriver.Config{Schema: schema}
		if i%2 == 1 {
			cfg = &pgdriver.Config{} // through search_path
		}
		drivers = append(drivers, newBareDriver(t, pool, cfg))
	}
	errs := make([]error, len(drivers))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, d := range drivers {
		wg.Go(func() {
			<-start
			errs[i] = d.Migrate(ctx)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: Migrate: %v", i, err)
		}
	}
}

// A migration that must lock a table held by a long transaction gives up
// after its lock_timeout, so the application's writes queued behind its
// lock request go on, and it is tried again: once the transaction ends,
// Migrate completes.
func TestMigrationYieldsToLongTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := migratedTo(t, 7) // 008 locks outbox
	pool := drv.Pool()
	report, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = report.Rollback(ctx) }()
	if _, err := report.Exec(ctx, `SELECT count(*) FROM outbox`); err != nil { // a long report
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() { migrated <- drv.Migrate(ctx) }()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass('outbox')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the migration never waited for the outbox's lock")
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := pool.Exec(wctx, `INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
		VALUES (gen_random_uuid(), 't', 'k', '\x00', now(), now())`); err != nil {
		t.Fatalf("an enqueue while the migration waits: %v after %s; want it through once the migration gives up", err, time.Since(start))
	}
	_ = report.Rollback(ctx)
	select {
	case err := <-migrated:
		if err != nil {
			t.Fatalf("Migrate after the long transaction ended: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Migrate did not finish after the long transaction ended")
	}
	if err := drv.Validate(ctx); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("outbox rows after the migration: %d, %v; want the one enqueued", n, err)
	}
}

// Inbox partitioning refuses a table prefix long enough for PostgreSQL to
// cut its derived names into collisions; 31 characters work.
func TestPartitioningTablePrefixTooLong(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, n := range []int{31, 32} {
		pool, schema := testdb.Schema(t, 4)
		drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema, TablePrefix: strings.Repeat("p", n)})
		if err := drv.Migrate(ctx); err != nil {
			t.Fatalf("Migrate with a %d-character prefix: %v", n, err)
		}
		err := drv.EnableInboxPartitioning(ctx, nil)
		if n == 31 && err != nil {
			t.Errorf("EnableInboxPartitioning with a 31-character prefix: %v", err)
		}
		if n == 32 && (err == nil || !strings.Contains(err.Error(), "at most 31")) {
			t.Errorf("EnableInboxPartitioning with a 32-character prefix: %v; want it refused", err)
		}
	}
}

// Replicas that name the schema and replicas that reach it through their
// search_path share the maintenance lock of partition changes (the
// migration lock) too: converting the inbox from both at once succeeds.
func TestEnableInboxPartitioningMixedReplicas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 2)
	if err := newBareDriver(t, pool, &pgdriver.Config{Schema: schema}).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var drivers []*pgdriver.Driver
	for i := range 4 {
		cfg := &pgdriver.Config{Schema: schema}
		if i%2 == 1 {
			cfg = &pgdriver.Config{} // through search_path
		}
		drivers = append(drivers, newBareDriver(t, testdb.Pool(t, schema, 2), cfg))
	}
	errs := make([]error, len(drivers))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, d := range drivers {
		wg.Go(func() {
			<-start
			errs[i] = d.EnableInboxPartitioning(ctx, nil)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: EnableInboxPartitioning: %v", i, err)
		}
	}
	if ok, err := drivers[0].InboxPartitioned(ctx); err != nil || !ok {
		t.Errorf("InboxPartitioned = %v, %v; want true", ok, err)
	}
}

// MigrateTx joins the caller's transaction without changing its settings
// (no lock_timeout of Migrate's), and refuses a schema a newer binary
// migrated.
func TestMigrateTxKeepsCallerSettings(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 4)
	drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = 0`); err != nil {
		t.Fatal(err)
	}
	if err := drv.MigrateTx(ctx, tx); err != nil {
		t.Fatalf("MigrateTx: %v", err)
	}
	var lt string
	if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil || lt != "0" {
		t.Fatalf("lock_timeout of the caller's transaction after MigrateTx: %q, %v; want 0 (the caller's)", lt, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+drv.Table("idem_migration")+` (version, name) VALUES (999, 'from_the_future')`); err != nil {
		t.Fatal(err)
	}
	if err := drv.MigrateTx(ctx, tx); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("MigrateTx on a schema with version 999: %v; want it refused", err)
	}
}

// A migrator whose session ends half way (its process killed, its
// connection lost) leaves the migrations it committed applied and the one
// it was running not at all, and the next Migrate goes on from there: 006
// committed, 007 (waiting for its lock on processed_event) left nothing,
// and the events enqueued before are all still to be published after 008.
func TestMigrateInterruptedResumes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := migratedTo(t, 5)
	pool := drv.Pool()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
		SELECT gen_random_uuid(), 't', 'k' || g, '\x00', now(), now() FROM generate_series(1, 3) g`); err != nil {
		t.Fatal(err)
	}
	report, err := pool.Begin(ctx) // holds processed_event, which 007 locks
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = report.Rollback(context.Background()) }()
	if _, err := report.Exec(ctx, `SELECT count(*) FROM processed_event`); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() { migrated <- drv.Migrate(ctx) }()
	var pid int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE NOT granted AND relation = to_regclass('processed_event')`).Scan(&pid)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("007 never waited for its lock on processed_event")
		}
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-migrated:
		if err == nil {
			t.Fatal("Migrate whose session was terminated returned nil")
		}
	case <-time.After(time.Minute):
		t.Fatal("Migrate did not return after its session was terminated")
	}
	st, err := drv.MigrationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lane, oldKey bool
	if err := pool.QueryRow(ctx, `SELECT
			EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'outbox' AND column_name = 'lane'),
			(SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'processed_event_pkey' AND connamespace = current_schema()::regnamespace) = 'PRIMARY KEY (consumer_name, event_id)'`).Scan(&lane, &oldKey); err != nil {
		t.Fatal(err)
	}
	if st.Current() != 6 || !lane || !oldKey {
		t.Fatalf("after the migrator's session ended in 007: version %d, outbox.lane %v, processed_event's key unchanged %v; want 6 applied, 007 not at all", st.Current(), lane, oldKey)
	}
	if err := report.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if err := drv.Validate(ctx); err != nil {
		t.Fatal(err)
	}
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_pending`).Scan(&pending); err != nil || pending != 3 {
		t.Fatalf("events to publish after the migrations: %d, %v; want the 3 enqueued before", pending, err)
	}
}

// A service runs as a role that may read and write idem's tables, and a
// later migration created tables without a grant for it (no ALTER DEFAULT
// PRIVILEGES): Validate passes, and every enqueue would fail with
// "permission denied for table outbox_pending". CheckPrivileges names the
// tables, what the role lacks and the GRANT, which, run as the owner,
// makes it pass.
func TestCheckPrivileges(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 2)
	if err := newBareDriver(t, pool, &pgdriver.Config{Schema: schema}).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	app := testdb.DMLPool(t, pool, schema)
	for _, c := range []*pgdriver.Config{{Schema: schema}, {}} {
		if err := newBareDriver(t, app, c).CheckPrivileges(ctx); err != nil {
			t.Errorf("CheckPrivileges (Schema %q) with every privilege: %v", c.Schema, err)
		}
	}
	role := schema + "_dml"
	// UPDATE of an outbox row is never needed (an event is written once).
	if _, err := pool.Exec(ctx, `REVOKE UPDATE ON outbox FROM `+role); err != nil {
		t.Fatal(err)
	}
	if err := newBareDriver(t, app, &pgdriver.Config{}).CheckPrivileges(ctx); err != nil {
		t.Errorf("CheckPrivileges without UPDATE on outbox: %v", err)
	}
	if _, err := pool.Exec(ctx, `REVOKE ALL ON outbox_pending, outbox_published FROM `+role+`; REVOKE DELETE ON saga FROM `+role); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pgdriver.Config{{Schema: schema}, {}} {
		drv := newBareDriver(t, app, c)
		if err := drv.Validate(ctx); err != nil {
			t.Fatalf("Validate: %v", err)
		}
		err := drv.CheckPrivileges(ctx)
		if err == nil {
			t.Fatalf("CheckPrivileges (Schema %q) without privileges on outbox_pending, outbox_published and DELETE on saga: nil", c.Schema)
		}
		msg := err.Error()
		for _, want := range []string{
			`role "` + role + `" lacks privileges`,
			`outbox_pending (SELECT, INSERT, UPDATE, DELETE)`, `outbox_published (SELECT, INSERT, UPDATE, DELETE)`, `saga (DELETE)`,
			`GRANT SELECT, INSERT, UPDATE, DELETE ON ` + drv.Table("outbox_pending") + `, ` + drv.Table("outbox_published") + `, ` + drv.Table("saga") + ` TO "` + role + `"`,
		} {
			if !strings.Contains(msg, want) {
				t.Errorf("CheckPrivileges (Schema %q): %q does not say %q", c.Schema, msg, want)
			}
		}
		if strings.Contains(msg, "saga_step") || strings.Contains(msg, "outbox ") {
			t.Errorf("CheckPrivileges (Schema %q) names a table the role has every privilege on: %s", c.Schema, msg)
		}
	}
	// The GRANT it names, run by the owner.
	msg := newBareDriver(t, app, &pgdriver.Config{Schema: schema}).CheckPrivileges(ctx).Error()
	grant := msg[strings.Index(msg, "GRANT "):strings.Index(msg, " (ALTER DEFAULT")]
	if _, err := pool.Exec(ctx, grant); err != nil {
		t.Fatalf("%s: %v", grant, err)
	}
	if err := newBareDriver(t, app, &pgdriver.Config{}).CheckPrivileges(ctx); err != nil {
		t.Errorf("CheckPrivileges after %s: %v", grant, err)
	}
}

// The service's role, which may not change the schema, finds migrations
// pending (the deployment step that migrates as the owner did not run, or
// not yet): Migrate's error says so, and what to do, besides PostgreSQL's
// "permission denied for schema".
func TestMigratePendingWithoutCreatePrivilege(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, pending := range []string{"all", "008"} {
		t.Run(pending, func(t *testing.T) {
			t.Parallel()
			pool, schema := testdb.Schema(t, 2)
			owner := newBareDriver(t, pool, &pgdriver.Config{Schema: schema})
			if pending == "008" {
				if err := owner.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `DELETE FROM idem_migration WHERE version = 8`); err != nil {
					t.Fatal(err)
				}
			}
			app := testdb.DMLPool(t, pool, schema)
			for _, c := range []*pgdriver.Config{{Schema: schema}, {}} {
				err := newBareDriver(t, app, c).Migrate(ctx)
				if err == nil || !strings.Contains(err.Error(), "permission denied") ||
					!strings.Contains(err.Error(), "migrations are pending and this role may not run them: run them first as the tables' owner") {
					t.Errorf("Migrate (Schema %q) of pending migrations without CREATE rights: %v; want permission denied, and what to do", c.Schema, err)
				}
			}
		})
	}
}
