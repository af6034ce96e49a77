package pgdriver_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

func inboxIDs(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	out := make([]uuid.UUID, n)
	for i := range out {
		id, err := uuid.NewV7()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = id
	}
	return out
}

func sortedIDs(ids []uuid.UUID) []uuid.UUID {
	return driver.SortedUniqueIDs(ids)
}

func mustInboxInsert(t *testing.T, ex driver.Executor, consumer string, ids, want []uuid.UUID) {
	t.Helper()
	got, err := ex.InboxInsert(t.Context(), &driver.InboxInsertParams{Consumer: consumer, IDs: ids, Now: time.Now()})
	if err != nil {
		t.Fatalf("InboxInsert(%q, %d ids): %v", consumer, len(ids), err)
	}
	if !slices.Equal(sortedIDs(got), sortedIDs(want)) {
		t.Fatalf("InboxInsert(%q, %d ids) returned %d new ids; want %d", consumer, len(ids), len(got), len(want))
	}
}

// A batch with an id recorded before fails its plain INSERT inside a
// savepoint: the caller's transaction goes on as if nothing happened (its
// earlier and later statements commit), and the savepoint is gone.
func TestInboxBatchWithDuplicatesKeepsTransaction(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	old := inboxIDs(t, 20)
	mustInboxInsert(t, drv.Executor(), "c", old, old)

	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `CREATE TABLE effect (n int)`); err != nil {
		t.Fatal(err)
	}
	fresh := inboxIDs(t, 20)
	mustInboxInsert(t, drv.UnwrapExecutor(tx), "c", slices.Concat(fresh[:10], old[5:]), fresh[:10])
	mustInboxInsert(t, drv.UnwrapExecutor(tx), "c", fresh, fresh[10:]) // fresh[:10] recorded by tx above
	mustInboxInsert(t, drv.UnwrapExecutor(tx), "c", fresh, nil)
	_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT idem_inbox_insert`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3B001" { // invalid_savepoint_specification
		t.Fatalf("ROLLBACK TO the inbox's savepoint after InboxInsert returned: %v; want no such savepoint", err)
	}
	// The failed ROLLBACK TO aborted tx; a new one checks what committed.
	_ = tx.Rollback(ctx)

	tx, err = drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE effect (n int)`); err != nil {
		t.Fatal(err)
	}
	mustInboxInsert(t, drv.UnwrapExecutor(tx), "c", slices.Concat(old, fresh), fresh)
	if _, err := tx.Exec(ctx, `INSERT INTO effect VALUES (1)`); err != nil {
		t.Fatalf("the transaction is not usable after a batch with duplicates: %v", err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	mustInboxInsert(t, drv.Executor(), "c", slices.Concat(old, fresh), nil)
	var n int
	if err := drv.Pool().QueryRow(ctx, `SELECT count(*) FROM effect`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("effect rows = %d, %v; want 1", n, err)
	}
}

// pkColumns returns the columns of the primary key of rel, in key order.
func pkColumns(t *testing.T, drv *pgdriver.Driver, rel string) []string {
	t.Helper()
	var cols []string
	err := drv.Pool().QueryRow(t.Context(), `SELECT array_agg(a.attname::text ORDER BY k.ord)
		FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1::regclass AND i.indisprimary`, rel).Scan(&cols)
	if err != nil {
		t.Fatalf("primary key of %s: %v", rel, err)
	}
	return cols
}

// unmigrate puts processed_event back as migration 006 left it: primary key
// (consumer_name, event_id), migration 007 not applied.
func unmigrate(t *testing.T, drv *pgdriver.Driver) {
	t.Helper()
	for _, q := range []string{
		`ALTER TABLE processed_event DROP CONSTRAINT processed_event_pkey,
			ADD CONSTRAINT processed_event_pkey PRIMARY KEY (consumer_name, event_id)`,
		`DELETE FROM idem_migration WHERE version = 7`,
	} {
		if _, err := drv.Pool().Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// Migration 007 keeps the rows of an existing inbox, plain or partitioned:
// an event recorded before it is still a duplicate after it, for its
// consumer only.
func TestInboxMigration007KeepsRows(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		name := "plain"
		if partitioned {
			name = "partitioned"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			drv := testdb.Postgres(t)
			ctx := t.Context()
			if partitioned {
				if err := drv.EnableInboxPartitioning(ctx, nil); err != nil {
					t.Fatal(err)
				}
			}
			unmigrate(t, drv)
			if got := pkColumns(t, drv, "processed_event"); !slices.Equal(got, []string{"consumer_name", "event_id"}) {
				t.Fatalf("before: primary key %v", got)
			}
			// Today's UUIDv7 ids and ids of no day (the default
			// partition), recorded with the old key.
			ids := inboxIDs(t, 30)
			for i := range 10 {
				ids[i][0] = 0xf0 | ids[i][0]&0x0f
			}
			mustInboxInsert(t, drv.Executor(), "a", ids, ids)
			mustInboxInsert(t, drv.Executor(), "b", ids[:3], ids[:3])

			if err := drv.Migrate(ctx); err != nil {
				t.Fatalf("migrate: %v", err)
			}
			want := []string{"event_id", "consumer_name"}
			if got := pkColumns(t, drv, "processed_event"); !slices.Equal(got, want) {
				t.Fatalf("after: primary key %v; want %v", got, want)
			}
			if partitioned {
				parts, err := drv.InboxPartitions(ctx)
				if err != nil || len(parts) < 2 {
					t.Fatalf("partitions %v, %v", parts, err)
				}
				for _, p := range parts {
					if got := pkColumns(t, drv, p.Name); !slices.Equal(got, want) {
						t.Errorf("partition %s: primary key %v; want %v", p.Name, got, want)
					}
				}
			}
			var rows int
			if err := drv.Pool().QueryRow(ctx, `SELECT count(*) FROM processed_event`).Scan(&rows); err != nil || rows != 33 {
				t.Fatalf("%d rows after the migration, %v; want 33", rows, err)
			}
			fresh := inboxIDs(t, 10)
			mustInboxInsert(t, drv.Executor(), "a", slices.Concat(ids, fresh), fresh)
			mustInboxInsert(t, drv.Executor(), "b", ids, ids[3:])
			for _, id := range ids[:2] {
				mustInboxInsert(t, drv.Executor(), "a", []uuid.UUID{id}, nil)
			}
			mustInboxInsert(t, drv.Executor(), "c", ids[:1], ids[:1])
		})
	}
}

// On a partitioned inbox, a duplicate in a batch is reported by one
// partition's index; the batch still gets exactly its new ids, in a
// transaction or not.
func TestInboxPartitionedBatchDuplicates(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	if err := drv.EnableInboxPartitioning(ctx, nil); err != nil {
		t.Fatal(err)
	}
	ids := inboxIDs(t, 40)
	for i := range 20 { // default partition
		ids[i][0] = 0xf0 | ids[i][0]&0x0f
	}
	mustInboxInsert(t, drv.Executor(), "a", ids[:10], ids[:10])
	mustInboxInsert(t, drv.Executor(), "a", ids[15:25], ids[15:25])
	mustInboxInsert(t, drv.Executor(), "a", ids[:30], slices.Concat(ids[10:15], ids[25:30]))
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustInboxInsert(t, drv.UnwrapExecutor(tx), "a", ids, ids[30:])
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	mustInboxInsert(t, drv.Executor(), "a", ids, nil)
}

// A replica's EnableInboxPartitioning while another one converts the table
// (or migrates the schema): it waits for the other's maintenance lock, then
// finds the table converted, instead of failing on lock_timeout after
// PartitionLockTimeout. Replicas started together failed that way whenever
// the conversion outlasted 2 s: a large inbox, or a busy machine.
func TestEnableInboxPartitioningWaitsForTheMaintenanceLock(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	holder, err := drv.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, drv.MaintenanceLockKey()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- drv.EnableInboxPartitioning(ctx, nil) }()
	select {
	case err := <-done:
		t.Fatalf("EnableInboxPartitioning returned while another held the maintenance lock: %v", err)
	case <-time.After(pgdriver.PartitionLockTimeout + time.Second):
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("EnableInboxPartitioning after the lock was released: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("EnableInboxPartitioning still waiting 60 s after the lock was released")
	}
	if ok, err := drv.InboxPartitioned(ctx); err != nil || !ok {
		t.Fatalf("InboxPartitioned = %v, %v", ok, err)
	}
}

// seqScans returns how many sequential scans processed_event has had, once
// this session's statistics are flushed (PostgreSQL 15+).
func seqScans(t *testing.T, drv *pgdriver.Driver) int64 {
	t.Helper()
	ctx := t.Context()
	if _, err := drv.Pool().Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Skipf("pg_stat_force_next_flush: %v", err)
	}
	var n int64
	if err := drv.Pool().QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'processed_event'::regclass`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The cleanup's batches go through the indexes: none of them scans the
// whole table (which would read the dead rows of the earlier batches
// again, every batch), also on a table the planner knows to be large.
func TestInboxDeleteBeforeUsesIndexes(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 1) // one session: its statistics are the table's
	drv := newDriver(t, pool, &pgdriver.Config{Schema: schema})
	ctx := t.Context()
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := pool.Exec(ctx, `INSERT INTO processed_event (event_id, consumer_name, processed_at)
		SELECT gen_random_uuid(), 'c' || (i % 3), $1::timestamptz - i * interval '1 second'
		FROM generate_series(1, 60000) AS i`, now); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE processed_event`); err != nil {
		t.Fatal(err)
	}
	before := now.Add(-12 * time.Hour) // 60000 s ~ 16.7 h: about 17,000 rows expired
	seq := seqScans(t, drv)
	deleted := 0
	for _, consumer := range []string{"", "", "c1", "", "c2"} {
		res, err := drv.Executor().InboxDeleteBefore(ctx, &driver.InboxDeleteBeforeParams{Consumer: consumer, Before: before, Limit: 1000})
		if err != nil || res.Deleted != 1000 {
			t.Fatalf("InboxDeleteBefore(%q) = %d, %v; want 1000", consumer, res.Deleted, err)
		}
		deleted += res.Deleted
	}
	if got := seqScans(t, drv); got != seq {
		t.Errorf("%d sequential scans of processed_event during 5 cleanup batches; want none", got-seq)
	}
	var left, young int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE processed_at < $1), count(*) FILTER (WHERE processed_at >= $1)
		FROM processed_event`, before).Scan(&left, &young); err != nil {
		t.Fatal(err)
	}
	if left+young+deleted != 60000 || young < 43000 {
		t.Errorf("after deleting %d: %d expired and %d young rows left; want 60000 in all, the young ones kept", deleted, left, young)
	}
}

// The conversion to a partitioned inbox keeps the old table's grants and
// owner: an application role granted SELECT, INSERT, DELETE on
// processed_event was refused every insert after it before, a full consumer
// outage.
func TestInboxPartitioningKeepsPrivileges(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 4)
	drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema})
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	app, owner := schema+"_app", schema+"_owner"
	t.Cleanup(func() {
		for _, r := range []string{app, owner} {
			_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+r)
			_, _ = pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+r)
		}
	})
	table := schema + ".processed_event"
	for _, s := range []string{
		`CREATE ROLE ` + app + ` NOLOGIN`,
		`CREATE ROLE ` + owner + ` NOLOGIN`,
		`GRANT CREATE, USAGE ON SCHEMA ` + schema + ` TO ` + owner,
		`ALTER TABLE ` + table + ` OWNER TO ` + owner,
		`GRANT SELECT, INSERT, DELETE ON ` + table + ` TO ` + app,
		`GRANT SELECT ON ` + table + ` TO PUBLIC`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(s, err)
		}
	}
	if err := drv.EnableInboxPartitioning(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := drv.InboxPartitioned(ctx); err != nil || !ok {
		t.Fatalf("InboxPartitioned = %v, %v; want true", ok, err)
	}
	for _, c := range []struct {
		role, priv string
		want       bool
	}{
		{app, "SELECT", true}, {app, "INSERT", true}, {app, "DELETE", true},
		{app, "UPDATE", false}, {"public", "SELECT", true}, {"public", "INSERT", false},
	} {
		var got bool
		if err := pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2, $3)`, c.role, table, c.priv).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("has_table_privilege(%s, processed_event, %s) = %v after the conversion; want %v", c.role, c.priv, got, c.want)
		}
	}
	rows, err := pool.Query(ctx, `SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname LIKE 'processed_event%' AND c.relkind IN ('r', 'p')`, schema)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var rel, got string
		if err := rows.Scan(&rel, &got); err != nil {
			t.Fatal(err)
		}
		n++
		if got != owner {
			t.Errorf("%s is owned by %s after the conversion; want %s", rel, got, owner)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("%d processed_event tables; want the parent and its partitions", n)
	}
}
