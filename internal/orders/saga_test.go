package orders_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/internal/orders"
	ordsqlite "github.com/idemkit/idem/internal/orders/sqlitestore"
	paysqlite "github.com/idemkit/idem/internal/payments/sqlitestore"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/saga"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A saga that can never be compensated (its charge completed, and idemd
// has no refunds) is Failed for an operator: the compensator logs it when
// it fails, then leaves it alone instead of flipping it back to
// Compensating and warning about it every few seconds, forever.
func TestRecoverLeavesUncompensableFailedSaga(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := testdb.SQLite(t)
	pay, ord := paysqlite.New(drv.DB()), ordsqlite.New(drv.DB())
	for _, m := range []func(context.Context) error{pay.Migrate, ord.Migrate} {
		if err := m(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sagas, err := saga.New(drv, &saga.Config{CompensationBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.NewTextHandler(logs, nil)))
	inTx := func(fn func(tx *sql.Tx) error) {
		t.Helper()
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	var o orders.Order
	inTx(func(tx *sql.Tx) (err error) {
		o, err = ord.Create(ctx, tx, orders.NewOrder{CustomerID: 7, Amount: decimal.RequireFromString("12.5"), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
		return err
	})
	e, err := orders.CreatedEvent(o)
	if err != nil {
		t.Fatal(err)
	}
	inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, e) }) // charged
	id := orders.SagaID(o.ID)
	// An operator (or an older idemd with another limit) aborted it after
	// its charge: compensating it fails for good.
	inTx(func(tx *sql.Tx) error { return sagas.Abort(ctx, tx, id) })
	if n, err := ps.Recover(ctx, orders.RecoverBatch); err != nil || n != 0 {
		t.Fatalf("Recover: %d, %v", n, err)
	}
	s, err := sagas.Get(ctx, id)
	if err != nil || s.State != saga.Failed {
		t.Fatalf("saga %v, %v; want Failed", s, err)
	}
	if !strings.Contains(logs.String(), "compensation failed") {
		t.Errorf("the failure was not logged: %s", logs)
	}
	before := logs.String()
	for range 3 {
		if n, err := ps.Recover(ctx, orders.RecoverBatch); err != nil || n != 0 {
			t.Fatalf("Recover: %d, %v", n, err)
		}
	}
	if after := logs.String(); after != before {
		t.Errorf("later recoveries logged again:\n%s", strings.TrimPrefix(after, before))
	}
	s2, err := sagas.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if s2.State != saga.Failed || !s2.UpdatedAt.Equal(s.UpdatedAt) {
		t.Errorf("saga touched again: %s updated %s (was %s)", s2.State, s2.UpdatedAt, s.UpdatedAt)
	}
}
