package idemkafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

// A handler that runs a failing statement, ignores its error and returns
// nil leaves PostgreSQL's transaction aborted: the inbox's COMMIT answers
// ROLLBACK (pgx.ErrTxCommitRollback), and nothing says which record was at
// fault. The database answered (nothing was committed, and the same effects
// fail the same way): the records' fault, not an outage. The batch's
// records are applied one at a time, the one at fault is dead-lettered
// after Retry.Attempts, the others are applied. Retried as a database
// outage for ever before: the partition never moved again. bad is the
// event at fault: in the middle of the batch (the next handler's statement
// fails, 25P02, and names the wrong event) or its last.
func TestCommitRollbackDeadLettered(t *testing.T) {
	t.Parallel()
	for _, bad := range []int{2, 4} {
		t.Run(fmt.Sprintf("pgdriver/event%d", bad), func(t *testing.T) {
			t.Parallel()
			testdb.RequirePostgres(t)
			b := setupPostgres(t)
			runCommitRollback(t, b, bad, func(ctx context.Context, tx pgx.Tx) {
				_, _ = tx.Exec(ctx, `SELECT 1/0`) // error ignored: the transaction is aborted
			})
		})
		t.Run(fmt.Sprintf("pgsqldriver/event%d", bad), func(t *testing.T) {
			t.Parallel()
			testdb.RequirePostgres(t)
			b := setupPostgresSQL(t)
			runCommitRollback(t, b, bad, func(ctx context.Context, tx *sql.Tx) {
				_, _ = tx.ExecContext(ctx, `SELECT 1/0`)
			})
		})
	}
}

func runCommitRollback[TTx any](t *testing.T, b *backend[TTx], bad int, fail func(ctx context.Context, tx TTx)) {
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "swallow", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 5, 1)
	badID := evs[bad].ID
	cfg := consumerConfig(kc, b, "ledger", group, nil, topic)
	effect := cfg.Handler
	cfg.Handler = func(ctx context.Context, tx TTx, e event.Envelope) error {
		if err := effect(ctx, tx, e); err != nil {
			return err
		}
		if e.ID == badID {
			fail(ctx, tx)
		}
		return nil
	}
	runDeferred(t, kc, b, cfg, topic, group, evs, badID) // consumer "ledger"
}

// setupPostgresSQL is setupPostgres through pgsqldriver (database/sql, the
// pgx stdlib driver).
func setupPostgresSQL(t testing.TB) *backend[*sql.Tx] {
	t.Helper()
	_, schema := testdb.Schema(t, 1)
	db := testdb.SQLPool(t, schema, 2)
	open := func(t testing.TB) driver.Driver[*sql.Tx] {
		t.Helper()
		drv, err := pgsqldriver.New(testdb.SQLPool(t, schema, 4), &pgsqldriver.Config{Schema: schema})
		if err != nil {
			t.Fatalf("pgsqldriver.New: %v", err)
		}
		return drv
	}
	if err := open(t).Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := db.Exec(pgEffectTable); err != nil {
		t.Fatalf("create effect table: %v", err)
	}
	return &backend[*sql.Tx]{
		name: "postgres-sql",
		open: open,
		effect: func(ctx context.Context, tx *sql.Tx, consumer string, e event.Envelope) error {
			n, err := payloadN(e)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO effect (consumer, event_id, key, n) VALUES ($1, $2, $3, $4)`, consumer, e.ID, e.Key, n)
			return err
		},
		rows: func(t testing.TB, consumer string) []effectRow {
			t.Helper()
			rows, err := db.Query(fmt.Sprintf(effectRowsQuery, "$1"), consumer)
			if err != nil {
				t.Fatalf("query effects: %v", err)
			}
			defer func() { _ = rows.Close() }()
			var out []effectRow
			for rows.Next() {
				var e effectRow
				if err := rows.Scan(&e.ID, &e.Key, &e.N); err != nil {
					t.Fatalf("read effects: %v", err)
				}
				out = append(out, e)
			}
			if err := rows.Err(); err != nil {
				t.Fatalf("read effects: %v", err)
			}
			return out
		},
		processed: func(t testing.TB, consumer string) int {
			t.Helper()
			var n int
			if err := db.QueryRow(fmt.Sprintf(processedQuery, "$1"), consumer).Scan(&n); err != nil {
				t.Fatalf("count processed_event: %v", err)
			}
			return n
		},
		// A crash child runs pgdriver on the same schema.
		env: []string{envBackend + "=postgres", envTarget + "=" + schema},
	}
}
