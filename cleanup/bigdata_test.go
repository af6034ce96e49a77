package cleanup_test

import (
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// A payments service writes idempotency records and inbox rows at up to
// 2,000/s each, so a sweep must delete faster than that with the default
// BatchSize (1000) and Pause (50 ms), through the retention indexes, while
// inserts go on. Seeded here: IDEM_BIGDATA_ROWS (default 1,000,000) expired
// rows in each of idempotency_record and processed_event, behind as many
// live ones; the sweep must keep above 4,000 rows/s (both tables' arrival
// rate) and read neither table sequentially. It takes a few minutes and
// several GB of disk: run it by hand with IDEM_BIGDATA=1 (README,
// "Sizing and autovacuum", quotes its figures).
func TestBigdataSweepKeepsPace(t *testing.T) {
	if os.Getenv("IDEM_BIGDATA") != "1" {
		t.Skip("IDEM_BIGDATA=1 runs the retention sweep over millions of rows (minutes)")
	}
	rows := 1_000_000
	if v := os.Getenv("IDEM_BIGDATA_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("IDEM_BIGDATA_ROWS=%q: want a positive number", v)
		}
		rows = n
	}
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 8)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	// Half expired, half live, as a table holding TTL plus a day has; one
	// record every 2 ms, one inbox row every 1 ms, with 300-byte bodies.
	seed := time.Now()
	for _, q := range []string{
		`INSERT INTO idempotency_record (scope, idempotency_key, fingerprint, state, http_status, body, created_at, expires_at)
			SELECT 'POST /v1/payments', md5(i::text), '\x0102030405060708', 'completed', 201, convert_to(repeat('y', 300), 'UTF8'),
				$1::timestamptz - interval '24 hours' + (i - $2) * interval '2 ms', $1::timestamptz + (i - $2) * interval '2 ms'
			FROM generate_series(1, 2 * $2) AS i`,
		`INSERT INTO processed_event (event_id, consumer_name, processed_at)
			SELECT gen_random_uuid(), 'c' || (i % 4), $1::timestamptz - interval '72 hours' + (i - $2 - 1) * interval '1 ms'
			FROM generate_series(1, 2 * $2) AS i`,
		`ANALYZE idempotency_record`,
		`ANALYZE processed_event`,
	} {
		args := []any{now, rows}
		if q[0] == 'A' {
			args = nil
		}
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("seed: %v\n%s", err, q)
		}
	}
	t.Logf("seeded 2 x %d rows in each table in %s", rows, time.Since(seed).Round(time.Second))

	before := indexReads(t, pool, schema)
	c, err := cleanup.New(drv, &cleanup.Config{
		Now:    func() time.Time { return now },
		Outbox: cleanup.OutboxRetention{Disabled: true},
		Sagas:  cleanup.SagaRetention{Disabled: true},
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
	deleted := rep.Deleted(cleanup.TableRecords) + rep.Deleted(cleanup.TableInbox)
	rate := float64(deleted) / took.Seconds()
	t.Logf("swept %d records and %d inbox rows in %s: %.0f rows/s with BatchSize %d, Pause %s",
		rep.Deleted(cleanup.TableRecords), rep.Deleted(cleanup.TableInbox), took.Round(time.Millisecond), rate,
		cleanup.DefaultBatchSize, cleanup.DefaultPause)
	for table, n := range map[string]int{cleanup.TableRecords: rep.Deleted(cleanup.TableRecords), cleanup.TableInbox: rep.Deleted(cleanup.TableInbox)} {
		if n != rows {
			t.Errorf("%s: the sweep deleted %d rows; want %d", table, n, rows)
		}
	}
	for _, heap := range []string{"idempotency_record", "processed_event"} {
		if seq := after["seq_scan:"+heap] - before["seq_scan:"+heap]; seq != 0 {
			t.Errorf("%d sequential scans of %s during the sweep; want none", seq, heap)
		}
	}
	// What autovacuum then has to reclaim: each table's dead rows, and
	// how long a plain VACUUM of it takes.
	for _, heap := range []string{"idempotency_record", "processed_event"} {
		var dead int64
		var size string
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT n_dead_tup, pg_size_pretty(pg_total_relation_size(relid))
			FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, heap).Scan(&dead, &size); err != nil {
			t.Fatal(err)
		}
		vacuum := time.Now()
		if _, err := pool.Exec(ctx, `VACUUM `+heap); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d dead rows, %s with its indexes; VACUUM took %s", heap, dead, size, time.Since(vacuum).Round(time.Millisecond))
	}
	if rate < 4000 {
		t.Errorf("the sweep deleted %.0f rows/s; want at least 4,000 (2,000/s arriving in each table)", rate)
	}
}
