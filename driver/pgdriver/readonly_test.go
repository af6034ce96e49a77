package pgdriver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// TestOutboxClaimReadOnlyUnreported: a relay whose sessions are read-only
// (a hot standby after a failover, default_transaction_read_only) on a
// server that does not report it to the client (PostgreSQL 12 and 13, or
// a pooler that does not pass it on) claims nothing: its claim asks, in
// the same round trip. Before, it claimed and published the batch, failed
// to mark it, and published it again at every round (outbox's
// TestRelayDatabaseReadOnly on PostgreSQL 12: 16 events published while
// read-only). The server here may report it: AskReadOnly runs the path of
// one that does not.
func TestOutboxClaimReadOnlyUnreported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, schema := testdb.Schema(t, 2)
	mig, err := pgdriver.New(owner, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := mig.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `INSERT INTO `+schema+`.outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
		VALUES ('0190b5a0-0000-7000-8000-000000000001', 'T', 'k', '\x00', now(), now())`); err != nil {
		t.Fatal(err)
	}
	for _, readOnly := range []bool{true, false} {
		cfg, err := pgxpool.ParseConfig(testdb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		if readOnly {
			cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		drv.AskReadOnly()
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := drv.UnwrapExecutor(tx).OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: time.Now(), Limit: 10})
		_ = tx.Rollback(ctx)
		pool.Close()
		if readOnly && (err == nil || !strings.Contains(err.Error(), "read-only (transaction_read_only = on)") || len(rows) != 0) {
			t.Errorf("read-only session: claimed %d rows, %v; want none and the read-only error", len(rows), err)
		}
		if !readOnly && (err != nil || len(rows) != 1) {
			t.Errorf("writable session: claimed %d rows, %v; want 1", len(rows), err)
		}
	}
}
