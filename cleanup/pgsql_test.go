package cleanup_test

import (
	"database/sql"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

// pgsqlReplica opens a second database/sql pool on drv's schema, as a
// second process would.
func pgsqlReplica(t *testing.T, drv driver.Driver[*sql.Tx]) driver.Driver[*sql.Tx] {
	t.Helper()
	var schema string
	if err := drv.(*pgsqldriver.Driver).DB().QueryRowContext(t.Context(), "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatalf("current_schema: %v", err)
	}
	r, err := pgsqldriver.New(testdb.SQLPool(t, schema, 10), &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgsqldriver.New: %v", err)
	}
	return r
}

// Publication log rows whose events were deleted by hand (an operator's
// purge) do not end the outbox sweep early: one sweep removes every log
// row and event older than the TTL behind them.
func TestOutboxSweepPastOrphanLogRows(t *testing.T) {
	t.Parallel()
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		drv := testdb.Postgres(t)
		testOutboxSweepPastOrphanLogRows(t, drv, func(q string) int {
			var n int
			if err := drv.Pool().QueryRow(t.Context(), q).Scan(&n); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return n
		})
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		drv := testdb.PostgresSQL(t)
		testOutboxSweepPastOrphanLogRows(t, drv, func(q string) int {
			var n int
			if err := drv.DB().QueryRowContext(t.Context(), q).Scan(&n); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return n
		})
	})
}

func testOutboxSweepPastOrphanLogRows[TTx any](t *testing.T, drv driver.Driver[TTx], count func(q string) int) {
	clPublished(t, drv, 10, t0.Add(-50*time.Hour))
	count(`WITH d AS (DELETE FROM outbox RETURNING 1) SELECT count(*) FROM d`) // the purge: 10 orphan log rows
	clPublished(t, drv, 10, t0.Add(-40*time.Hour))                             // old enough
	clPublished(t, drv, 3, t0.Add(-time.Hour))                                 // kept

	cfg := clConfig(fixedClock(t0)) // batches of 7: the first is all orphans
	rep := runOnce(t, newCleaner(t, drv, cfg))
	if n := count(`SELECT count(*) FROM outbox`); n != 3 {
		t.Errorf("%d events left after one sweep; want 3 (the young ones)", n)
	}
	if n := count(`SELECT count(*) FROM outbox_published`); n != 3 {
		t.Errorf("%d publication log rows left after one sweep; want 3", n)
	}
	if d := rep.Deleted(cleanup.TableOutbox); d != 20 {
		t.Errorf("report: %d outbox rows deleted; want 20 (10 orphan log rows, 10 events)", d)
	}
}

// A processed_event converted to partition mode (by pgdriver) and swept by a
// pgsqldriver cleaner without partition mode is ErrInboxPartitioning, as on
// pgdriver: its partitions would never be created ahead nor dropped.
func TestPartitionModeMismatchPgsqldriver(t *testing.T) {
	t.Parallel()
	drv, schema := testdb.PostgresSQLSchema(t)
	pg, err := pgdriver.New(testdb.Pool(t, schema, 4), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.EnableInboxPartitioning(t.Context(), nil); err != nil {
		t.Fatalf("EnableInboxPartitioning: %v", err)
	}
	c, err := cleanup.New(drv, &cleanup.Config{Logger: slog.New(slog.DiscardHandler), Pause: cleanup.NoPause})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(t.Context()); !errors.Is(err, cleanup.ErrInboxPartitioning) {
		t.Errorf("DELETE mode on a partitioned table through pgsqldriver: err = %v; want ErrInboxPartitioning", err)
	}
}
