package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/internal/orders/pgstore"
	"github.com/idemkit/idem/internal/testdb"
)

// Two replicas' partition batches touching the same customers in opposite
// orders: applied through orders.ProjectionBatch they lock the summary
// rows in the same (ascending) order, so PostgreSQL never reports a
// deadlock (40P01). A third transaction holds the rows until both batches
// wait for them, so that, were the rows locked in event order, each batch
// would hold a row the other one needs: a certain deadlock.
func TestProjectionBatchesNeverDeadlock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel() // never left waiting for a lock, whatever fails
	drv := testdb.Postgres(t)
	pool := drv.Pool()
	store := pgstore.New(pool)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	project := orders.ProjectionBatch(store)
	customers := []int64{1, 2, 3, 4} // 1 and 2 have rows already, 3 and 4 not
	seed, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Apply(ctx, seed, []orders.SummaryDelta{{CustomerID: 1, Orders: 1, LastOrderID: 1}, {CustomerID: 2, Orders: 1, LastOrderID: 2}}); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, seed); err != nil {
		t.Fatal(err)
	}

	nextOrder := int64(100)
	batch := func(ids []int64) []event.Envelope {
		var evs []event.Envelope
		for _, c := range ids {
			nextOrder++
			e, err := orders.OutcomeEvent(orders.EventOrderConfirmed, orders.Order{ID: nextOrder, CustomerID: c, Amount: decimal.RequireFromString("1.25")})
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, e)
		}
		return evs
	}
	const rounds = 3
	for round := range rounds {
		blocker, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = blocker.Rollback(context.Background()) }() // after Commit: a no-op
		if _, err := blocker.Exec(ctx, `SELECT 1 FROM customer_order_summary WHERE customer_id IN (1, 2) FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		forward := batch(customers)
		backward := batch([]int64{customers[3], customers[2], customers[1], customers[0]})
		errs := make(chan error, 2)
		pids := make(chan int32, 2)
		for _, evs := range [][]event.Envelope{forward, backward} {
			go func() {
				tx, err := drv.Begin(ctx)
				if err != nil {
					pids <- 0
					errs <- err
					return
				}
				var pid int32
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					_ = drv.Rollback(ctx, tx)
					pids <- 0
					errs <- err
					return
				}
				pids <- pid
				if err := project(ctx, tx, evs); err != nil {
					_ = drv.Rollback(ctx, tx)
					errs <- err
					return
				}
				errs <- drv.Commit(ctx, tx)
			}()
		}
		// Both batches wait for a lock: the blocker's rows (or, behind the
		// first one, the row's place in the queue).
		batchPIDs := []int32{<-pids, <-pids}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var waiting int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND wait_event_type = 'Lock'`, batchPIDs).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d batches wait for the blocker, want 2", round, waiting)
			}
		}
		if err := blocker.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := <-errs; err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
					t.Fatalf("round %d: deadlock: %v", round, err)
				}
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
	for _, c := range customers {
		s, err := store.Summary(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if s.Confirmed != 2*rounds || s.TotalAmount.StringFixed(4) != decimal.RequireFromString("2.5").Mul(decimal.NewFromInt(rounds)).StringFixed(4) {
			t.Errorf("customer %d: %+v", c, s)
		}
	}
}
