package outbox_test

import (
	"context"
	"database/sql"
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
		} else {
			t.Logf("EnqueueTx(nil tx, %d events): %v", n, err)
		}
	}
	if _, ok, err := drv.Outbox().OutboxOldestUnpublished(t.Context()); err != nil || ok {
		t.Errorf("after EnqueueTx with a nil tx: an unpublished event is stored (%v, %v); want none", ok, err)
	}
}
