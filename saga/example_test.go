package saga_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/saga"
)

// An order saga: reserve stock, then charge the card, which fails for good;
// the reservation is compensated. Every step runs once however often it is
// delivered, and the event it emits has an ID derived from the step.
func Example() {
	dir, _ := os.MkdirTemp("", "idem-saga-example")
	defer func() { _ = os.RemoveAll(dir) }()
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		panic(err)
	}
	defer func() { _ = drv.Close() }()
	ctx := context.Background()
	if err := drv.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE reservation (order_id TEXT PRIMARY KEY, released INTEGER NOT NULL DEFAULT 0)`); err != nil {
		panic(err)
	}
	sagas, err := saga.New(drv, nil)
	if err != nil {
		panic(err)
	}
	const orderID = "order-42"

	// The consumer of OrderCreated (delivered twice): start the saga and
	// reserve the stock, in one transaction (with inbox.ProcessTx in a
	// real consumer).
	reserve := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO reservation (order_id) VALUES (?)`, orderID); err != nil {
			return nil, err
		}
		ev, err := event.New("StockReserved.v1", orderID, map[string]string{"order": orderID})
		if err != nil {
			return nil, err
		}
		if _, err := sagas.EmitTx(ctx, tx, orderID, "reserve-stock", "", ev); err != nil {
			return nil, err
		}
		return []byte("reservation-" + orderID), nil
	}
	for range 2 {
		tx, err := drv.Begin(ctx)
		if err != nil {
			panic(err)
		}
		if _, _, err := sagas.StartTx(ctx, tx, orderID, "order", []byte(`{"amount":"99.9000"}`)); err != nil {
			panic(err)
		}
		res, ran, err := sagas.StepTx(ctx, tx, orderID, "reserve-stock", reserve)
		if err != nil {
			panic(err)
		}
		if err := drv.Commit(ctx, tx); err != nil {
			panic(err)
		}
		fmt.Printf("reserve-stock: ran=%v result=%s\n", ran, res)
	}

	// The card is declined: the charge step fails and is not recorded.
	_, _, err = sagas.Step(ctx, orderID, "charge-card", func(context.Context, *sql.Tx) ([]byte, error) {
		return nil, errors.New("card declined")
	})
	fmt.Println("charge-card:", err)

	// Undo what completed, most recent first.
	err = sagas.Compensate(ctx, orderID, saga.Compensations[*sql.Tx]{
		"reserve-stock": func(ctx context.Context, tx *sql.Tx, fwd saga.StepRecord) ([]byte, error) {
			fmt.Printf("releasing %s\n", fwd.Result)
			_, err := tx.ExecContext(ctx, `UPDATE reservation SET released = 1 WHERE order_id = ?`, orderID)
			return nil, err
		},
		"charge-card": nil, // never completed, never compensated
	})
	if err != nil {
		panic(err)
	}
	s, err := sagas.Get(ctx, orderID)
	if err != nil {
		panic(err)
	}
	fmt.Println("state:", s.State)
	for _, st := range s.Steps {
		fmt.Printf("step %d: %s\n", st.Seq, st.Name)
	}
	fmt.Println("event ID derived from the step:", saga.EventID(orderID, "reserve-stock", "") == event.StepID(orderID, "reserve-stock"))
	// Output:
	// reserve-stock: ran=true result=reservation-order-42
	// reserve-stock: ran=false result=reservation-order-42
	// charge-card: saga "order-42": step "charge-card" failed: card declined
	// releasing reservation-order-42
	// state: compensated
	// step 1: reserve-stock
	// step 2: compensate:reserve-stock
	// event ID derived from the step: true
}

// A step runs once per (sagaId, stepName), however often it is retried or
// redelivered; a retry gets the result recorded the first time.
func ExampleCoordinator_Step() {
	dir, _ := os.MkdirTemp("", "idem-saga-example")
	defer func() { _ = os.RemoveAll(dir) }()
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		panic(err)
	}
	defer func() { _ = drv.Close() }()
	ctx := context.Background()
	if err := drv.Migrate(ctx); err != nil { // creates saga and saga_step
		panic(err)
	}
	sagas, err := saga.New(drv, nil)
	if err != nil {
		panic(err)
	}
	tx, err := drv.Begin(ctx)
	if err != nil {
		panic(err)
	}
	if _, _, err := sagas.StartTx(ctx, tx, "order-7", "order", nil); err != nil {
		panic(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		panic(err)
	}

	charges := 0
	charge := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		charges++ // the effect, written through tx in a real step
		return []byte("charge-1"), nil
	}
	for range 3 { // the event that triggers the step, delivered three times
		res, ran, err := sagas.Step(ctx, "order-7", "charge-card", charge)
		if err != nil {
			panic(err)
		}
		fmt.Printf("ran=%v result=%s\n", ran, res)
	}
	fmt.Println("charges:", charges)
	// Output:
	// ran=true result=charge-1
	// ran=false result=charge-1
	// ran=false result=charge-1
	// charges: 1
}

// A saga stuck in Running (the event of its next step was lost, or its
// consumer keeps failing) changes nothing by itself. List finds the
// running sagas oldest first: a running saga's UpdatedAt is its start, as
// its steps do not change it. Page with ListAfter, stop at the first one
// started after the cutoff, and Get a candidate to see its last step.
func ExampleCoordinator_List() {
	dir, _ := os.MkdirTemp("", "idem-saga-example")
	defer func() { _ = os.RemoveAll(dir) }()
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		panic(err)
	}
	defer func() { _ = drv.Close() }()
	ctx := context.Background()
	if err := drv.Migrate(ctx); err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)
	sagas, err := saga.New(drv, &saga.Config{Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	noop := func(context.Context, *sql.Tx) ([]byte, error) { return nil, nil }
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		tx, err := drv.Begin(ctx)
		if err != nil {
			panic(err)
		}
		if _, _, err := sagas.StartTx(ctx, tx, id, "order", nil); err != nil {
			panic(err)
		}
		if _, _, err := sagas.StepTx(ctx, tx, id, "reserve-stock", noop); err != nil {
			panic(err)
		}
		if id == "order-2" { // finished: not running
			if err := sagas.CompleteTx(ctx, tx, id); err != nil {
				panic(err)
			}
		}
		if err := drv.Commit(ctx, tx); err != nil {
			panic(err)
		}
		now = now.Add(10 * time.Minute)
	}
	// A later step of order-1: its saga moves, its UpdatedAt does not.
	if _, _, err := sagas.Step(ctx, "order-1", "charge-card", noop); err != nil {
		panic(err)
	}

	// Running sagas started more than 15 minutes ago (now is 12:30).
	cutoff := now.Add(-15 * time.Minute)
	var after *saga.Saga
pages:
	for {
		page, err := sagas.ListAfter(ctx, 100, after, saga.Running)
		if err != nil {
			panic(err)
		}
		for _, s := range page {
			if !s.UpdatedAt.Before(cutoff) {
				break pages // the rest started later
			}
			full, err := sagas.Get(ctx, s.ID)
			if err != nil {
				panic(err)
			}
			last := full.Steps[len(full.Steps)-1]
			fmt.Printf("%s started %s, last step %s at %s\n", s.ID, s.UpdatedAt.Format("15:04"), last.Name, last.CompletedAt.Format("15:04"))
		}
		if len(page) < 100 {
			break
		}
		after = page[len(page)-1]
	}
	// Output:
	// order-1 started 12:00, last step charge-card at 12:30
}
