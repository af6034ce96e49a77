package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// EnqueueTx with no transaction (a nil *sql.Tx or pgx.Tx: a Begin whose
// error was ignored, a transaction not threaded through) is refused with an
// error and stores nothing. It neither panics nor, on SQLite, commits the
// event on its own, apart from the business write it belongs with.
func TestEnqueueTxNilTransaction(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testEnqueueNilTx[*sql.Tx](t, testdb.SQLite(t))
	})
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testEnqueueNilTx[pgx.Tx](t, testdb.Postgres(t))
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		testEnqueueNilTx[*sql.Tx](t, testdb.PostgresSQL(t))
	})
}

func testEnqueueNilTx[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	for _, n := range []int{1, 2} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("EnqueueTx(nil tx, %d events) panicked: %v", n, r)
				}
			}()
			var tx TTx
			evs := []string{"a", "b"}[:n]
			es := make([]event.Envelope, 0, n)
			for _, k := range evs {
				es = append(es, mustEvent(t, "niltx-"+k))
			}
			return outbox.EnqueueTx(context.Background(), drv, tx, es...)
		}()
		if err == nil {
			t.Errorf("EnqueueTx(nil tx, %d events) = nil; want an error", n)
		}
	}
	if _, ok, err := drv.Outbox().OutboxOldestUnpublished(t.Context()); err != nil || ok {
		t.Errorf("after EnqueueTx with a nil tx: an unpublished event is stored (%v, %v); want none", ok, err)
	}
}

// The errors the package doc promises for a transaction that cannot take
// the events: driver.ErrTxDone once it is committed or rolled back, and on
// PostgreSQL driver.ErrTxAborted once a failed statement aborted it.
func TestEnqueueTxEndedTransaction(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testEnqueueEndedTx[*sql.Tx](t, testdb.SQLite(t), nil)
	})
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testEnqueueEndedTx[pgx.Tx](t, testdb.Postgres(t), func(tx pgx.Tx) error {
			_, err := tx.Exec(t.Context(), "SELECT 1/0")
			return err
		})
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		testEnqueueEndedTx[*sql.Tx](t, testdb.PostgresSQL(t), func(tx *sql.Tx) error {
			_, err := tx.ExecContext(t.Context(), "SELECT 1/0")
			return err
		})
	})
}

func testEnqueueEndedTx[TTx any](t *testing.T, drv driver.OutboxDriver[TTx], fail func(TTx) error) {
	ctx := t.Context()
	for _, end := range []struct {
		name string
		end  func(TTx) error
	}{
		{"committed", func(tx TTx) error { return drv.Commit(ctx, tx) }},
		{"rolled back", func(tx TTx) error { return drv.Rollback(ctx, tx) }},
	} {
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := end.end(tx); err != nil {
			t.Fatal(err)
		}
		if err := outbox.EnqueueTx(ctx, drv, tx, mustEvent(t, "ended")); !errors.Is(err, driver.ErrTxDone) {
			t.Errorf("EnqueueTx in a transaction %s = %v; want driver.ErrTxDone", end.name, err)
		}
	}
	if fail != nil {
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := fail(tx); err == nil {
			t.Fatal("the failing statement succeeded")
		}
		if err := outbox.EnqueueTx(ctx, drv, tx, mustEvent(t, "aborted")); !errors.Is(err, driver.ErrTxAborted) {
			t.Errorf("EnqueueTx in an aborted transaction = %v; want driver.ErrTxAborted", err)
		}
		_ = drv.Rollback(ctx, tx)
	}
	if _, ok, err := drv.Outbox().OutboxOldestUnpublished(ctx); err != nil || ok {
		t.Errorf("an unpublished event is stored (%v, %v); want none", ok, err)
	}
}
