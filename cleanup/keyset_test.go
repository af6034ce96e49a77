package cleanup_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// While another transaction holds a snapshot older than the sweep (a long
// report, a replica with hot_standby_feedback), the index entries of the
// rows each batch deletes cannot be removed, and a batch that scans its
// table's retention index from the start walks over all of them: a sweep
// of N rows in batches of n read about N²/2n entries. Each batch resumes
// after the key of the batch before, so the entries read stay proportional
// to the rows deleted: counted here in pg_stat_user_indexes.idx_tup_read of
// the four retention indexes, for 20,000 expired rows each (in groups of 7
// sharing their time), swept in batches of 500.
func TestSweepUnderHeldSnapshotReadsIndexOnce(t *testing.T) {
	t.Parallel()
	const rows, batch = 20_000, 500
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 4)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old := now.Add(-30 * 24 * time.Hour)
	for _, q := range []string{
		`INSERT INTO idempotency_record (scope, idempotency_key, fingerprint, state, created_at, expires_at)
			SELECT 's' || (i % 2), 'k' || i, '\x00', 'completed', $1::timestamptz, $1::timestamptz + (i / 7) * interval '1 ms'
			FROM generate_series(1, $2) AS i`,
		`INSERT INTO processed_event (event_id, consumer_name, processed_at)
			SELECT gen_random_uuid(), 'c' || (i % 2), $1::timestamptz + (i / 7) * interval '1 ms'
			FROM generate_series(1, $2) AS i`,
		`INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
			SELECT gen_random_uuid(), 't', 'k' || i, '\x00', $1::timestamptz, $1::timestamptz
			FROM generate_series(1, $2) AS i`,
		`WITH p AS (DELETE FROM outbox_pending RETURNING id)
			INSERT INTO outbox_published (id, published_at)
			SELECT id, $1::timestamptz + (id / 7) * interval '1 ms' FROM p, (SELECT $2::int) AS unused`,
		`INSERT INTO saga (saga_id, saga_type, state, created_at, updated_at, finished_at)
			SELECT 's' || i, 't', 'completed', $1::timestamptz, $1::timestamptz, $1::timestamptz + (i / 7) * interval '1 ms'
			FROM generate_series(1, $2) AS i`,
	} {
		if _, err := pool.Exec(ctx, q, old, rows); err != nil {
			t.Fatalf("seed: %v\n%s", err, q)
		}
	}
	for _, table := range []string{"idempotency_record", "processed_event", "outbox", "outbox_published", "saga"} {
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}

	// The old snapshot: a REPEATABLE READ transaction on a connection of
	// its own that has read something (of a table not measured here), left
	// open until the sweep is done.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	if _, err := holder.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	var locks int
	if err := holder.QueryRow(ctx, `SELECT count(*) FROM idem_lock`).Scan(&locks); err != nil {
		t.Fatal(err)
	}

	type retention struct{ heap, index string }
	tables := map[string]retention{ // table in the report -> its table and retention index
		cleanup.TableRecords: {"idempotency_record", "idempotency_record_expires_at_idx"},
		cleanup.TableInbox:   {"processed_event", "processed_event_processed_at_idx"},
		cleanup.TableOutbox:  {"outbox_published", "outbox_published_at_idx"},
		cleanup.TableSagas:   {"saga", "saga_finished_at_idx"},
	}
	before := indexReads(t, pool, schema)
	c, err := cleanup.New(drv, &cleanup.Config{
		Now: func() time.Time { return now }, BatchSize: batch, Pause: cleanup.NoPause,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := c.RunOnce(ctx)
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	took := time.Since(start)
	after := indexReads(t, pool, schema)
	for table, r := range tables {
		read := after[r.index] - before[r.index]
		seq := after["seq_scan:"+r.heap] - before["seq_scan:"+r.heap]
		deleted := rep.Deleted(table) // outbox: publication log rows, each with its event
		t.Logf("%s: %d rows deleted, %d entries of %s read, %d sequential scans of %s (sweep %s)",
			table, deleted, read, r.index, seq, r.heap, took.Round(time.Millisecond))
		if deleted != rows {
			t.Errorf("%s: the sweep deleted %d rows; want %d", table, deleted, rows)
		}
		// Each entry once, plus per batch the rows of two time values
		// (the cursor's, the batch's last): about 20,450. From the
		// start of the index every batch, it is N + n(0+1+...+N/n-1) =
		// 410,000.
		if limit := int64(rows + rows/4); read > limit {
			t.Errorf("%s: %d entries of %s read to delete %d rows in batches of %d; want at most %d (not a scan from the index's start per batch)",
				table, read, r.index, deleted, batch, limit)
		}
		// A sequential scan reads the table from its first page, over
		// the dead rows of the earlier batches.
		if seq != 0 {
			t.Errorf("%s: %d sequential scans of %s during the sweep; want none (each batch reads the retention index from the cursor)", table, seq, r.heap)
		}
	}
}

// indexReads returns idx_tup_read of every index of schema, and as
// "seq_scan:<table>" seq_scan of every table, after the idle connections of
// pool (every one, after a sweep) have flushed their statistics.
func indexReads(t *testing.T, pool *pgxpool.Pool, schema string) map[string]int64 {
	t.Helper()
	ctx := t.Context()
	for _, c := range pool.AcquireAllIdle(ctx) {
		// Flushed when the session goes idle, before it answers.
		_, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		c.Release()
		if err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(ctx, `SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE schemaname = $1
		UNION ALL SELECT 'seq_scan:' || relname, seq_scan FROM pg_stat_user_tables WHERE schemaname = $1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		out[name] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
