package orders_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/orders"
	ordpg "github.com/idemkit/idem/internal/orders/pgstore"
	paypg "github.com/idemkit/idem/internal/payments/pgstore"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/saga"
)

// On PostgreSQL, the watchdog giving up on old orders while the saga
// consumer handles their OrderCreated.v1 at the same moment: each order
// ends CONFIRMED with one payment, or REJECTED with none; never REJECTED
// after a charge, never charged twice. (The saga's other tests run on
// SQLite, whose transactions never overlap.)
func TestSagaRacesWatchdogPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := testdb.Postgres(t)
	pay, ord := paypg.New(drv.Pool()), ordpg.New(drv.Pool())
	if err := pay.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ord.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	sagas, err := saga.New(drv, &saga.Config{CompensationBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
	wd, err := orders.NewWatchdog(drv, ps, ord, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute, Limit: 7,
		Now: startedAgo(31 * time.Minute)}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var evs []event.Envelope
	const n = 40
	for i := range n {
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		amount := "5"
		if i%5 == 0 {
			amount = "20000"
		}
		o, err := ord.Create(ctx, tx, orders.NewOrder{CustomerID: int64(i + 1), Amount: decimal.RequireFromString(amount), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `UPDATE customer_order SET created_at = now() - interval '1 hour' WHERE id = $1`, o.ID); err != nil {
			t.Fatal(err)
		}
		if err := drv.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		e, err := orders.CreatedEvent(o)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	handle := func(e event.Envelope) error {
		for {
			tx, err := drv.Begin(ctx)
			if err != nil {
				return err
			}
			err = ps.Handle(ctx, tx, e)
			if err == nil {
				err = drv.Commit(ctx, tx)
			} else {
				_ = drv.Rollback(ctx, tx)
			}
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001") {
				continue
			}
			return err
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, e := range evs {
			if err := handle(e); err != nil {
				t.Errorf("handle %s: %v", e.Key, err)
			}
		}
	}()
	for range 3 {
		if _, err := wd.RunOnce(ctx); err != nil {
			t.Errorf("watchdog: %v", err)
		}
	}
	wg.Wait()
	// The consumer then gets the PaymentCaptured.v1 of the charged orders,
	// and the compensator rejects the orders the watchdog gave up on.
	rows, err := drv.Pool().Query(ctx, `SELECT event_id, payload FROM outbox WHERE event_type = $1`, orders.EventPaymentCaptured)
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		id      string
		payload []byte
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rec, error) {
		var x rec
		err := r.Scan(&x.id, &x.payload)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		e := event.Envelope{Type: orders.EventPaymentCaptured, Payload: r.payload}
		if err := handle(e); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := ps.Recover(ctx, 100); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range evs {
		var oc orders.OrderCreated
		if err := json.Unmarshal(e.Payload, &oc); err != nil {
			t.Fatal(err)
		}
		o, err := ord.Get(ctx, oc.OrderID)
		if err != nil {
			t.Fatal(err)
		}
		var payments int
		if err := drv.Pool().QueryRow(ctx, `SELECT count(*) FROM payment WHERE external_payment_id = $1`, orders.SagaID(o.ID)).Scan(&payments); err != nil {
			t.Fatal(err)
		}
		switch {
		case o.Status == orders.StatusConfirmed && payments == 1 && o.PaymentID != 0:
		case o.Status == orders.StatusRejected && payments == 0:
		default:
			s, _ := sagas.Get(ctx, orders.SagaID(o.ID))
			t.Errorf("order %d (%s): %s with %d payments; saga %+v", o.ID, o.Amount, o.Status, payments, s)
		}
	}
}

// A database restored from a backup (or failed over to an asynchronous
// replica that lost its last commits) hands out the IDs of the orders it
// lost again, while their OrderCreated.v1 events are still in Kafka: a
// consumer that lagged at the time, or whose offsets were rewound, gets
// the lost order's event for the new order of that ID. The saga ignores
// it: it charges the new order its own amount to its own customer, never
// the lost order's.
func TestSagaIgnoresCreatedOfALostOrderWithTheSameID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Schema(t, 4)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pay, ord := paypg.New(drv.Pool()), ordpg.New(drv.Pool())
	if err := pay.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ord.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	sagas, err := saga.New(drv, &saga.Config{CompensationBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
	inTx := func(f func(tx pgx.Tx) error) {
		t.Helper()
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = drv.Rollback(ctx, tx) }()
		if err := f(tx); err != nil {
			t.Fatal(err)
		}
		if err := drv.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	create := func(customer int64, amount string) (o orders.Order, e event.Envelope) {
		t.Helper()
		inTx(func(tx pgx.Tx) (err error) {
			o, err = ord.Create(ctx, tx, orders.NewOrder{CustomerID: customer, Amount: decimal.RequireFromString(amount), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
			return err
		})
		e, err := orders.CreatedEvent(o)
		if err != nil {
			t.Fatal(err)
		}
		return o, e
	}

	backup := testdb.TakeSnapshot(t, schema)
	lost, lostCreated := create(7, "12.5")
	backup.Restore(t)
	again, againCreated := create(8, "300")
	if again.ID != lost.ID {
		t.Fatalf("the restored database gave the new order ID %d; want the lost order's %d", again.ID, lost.ID)
	}
	for _, e := range []event.Envelope{lostCreated, againCreated} {
		inTx(func(tx pgx.Tx) error { return ps.Handle(ctx, tx, e) })
	}
	got, err := ord.Get(ctx, again.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.PaymentID == 0 {
		t.Fatalf("order %d: no payment; want its charge", again.ID)
	}
	p, err := pay.Get(ctx, got.PaymentID)
	if err != nil {
		t.Fatal(err)
	}
	if p.CustomerID != again.CustomerID || !p.Amount.Equal(again.Amount) {
		t.Errorf("order %d (customer %d, %s) charged %s to customer %d: the lost order's charge",
			again.ID, again.CustomerID, again.Amount, p.Amount, p.CustomerID)
	}
	var captured []byte
	if err := pool.QueryRow(ctx, `SELECT payload FROM outbox WHERE event_type = $1`, orders.EventPaymentCaptured).Scan(&captured); err != nil {
		t.Fatal(err)
	}
	var pc orders.PaymentCaptured
	if err := json.Unmarshal(captured, &pc); err != nil {
		t.Fatal(err)
	}
	if pc.CustomerID != again.CustomerID || pc.Amount != again.Amount.StringFixed(orders.AmountScale) {
		t.Errorf("PaymentCaptured.v1 %s; want customer %d, amount %s", captured, again.CustomerID, again.Amount.StringFixed(orders.AmountScale))
	}
}

// The saga's events have IDs derived from the saga ID, and so from the
// order ID: the new order that a restored database gives a lost order's ID
// emits its PaymentCaptured.v1 under the lost one's event ID, which every
// inbox that applied the lost one (another service's database, or this
// one's after a consumer that lagged) drops as a duplicate. The runbook's
// step moves the sequence past every ID handed out before the restore:
// the new order gets an ID of its own, and so do its events.
func TestRestoreSequenceStepGivesNewEventIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Schema(t, 4)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pay, ord := paypg.New(drv.Pool()), ordpg.New(drv.Pool())
	if err := pay.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ord.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	sagas, err := saga.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
	// charge creates an order and runs its saga's charge: it returns the
	// order's ID and its PaymentCaptured.v1's event ID.
	charge := func() (int64, string) {
		t.Helper()
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = drv.Rollback(ctx, tx) }()
		o, err := ord.Create(ctx, tx, orders.NewOrder{CustomerID: 7, Amount: decimal.RequireFromString("12.5"), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		e, err := orders.CreatedEvent(o)
		if err != nil {
			t.Fatal(err)
		}
		if err := ps.Handle(ctx, tx, e); err != nil {
			t.Fatal(err)
		}
		var id string
		if err := tx.QueryRow(ctx, `SELECT event_id::text FROM outbox WHERE event_type = $1 AND record_key = $2`, orders.EventPaymentCaptured, e.Key).Scan(&id); err != nil {
			t.Fatalf("PaymentCaptured.v1 of order %d: %v", o.ID, err)
		}
		if err := drv.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		return o.ID, id
	}

	backup := testdb.TakeSnapshot(t, schema)
	lostOrder, lostEvent := charge()
	backup.Restore(t)
	againOrder, againEvent := charge()
	if againOrder != lostOrder || againEvent != lostEvent {
		t.Fatalf("without the step: order %d, event %s; want the lost order's ID %d and event ID %s", againOrder, againEvent, lostOrder, lostEvent)
	}

	backup.Restore(t)
	// The runbook's step, as docs/operations.md gives it.
	if _, err := pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('customer_order', 'id'), (SELECT coalesce(max(id), 0) FROM customer_order) + 1000000)`); err != nil {
		t.Fatal(err)
	}
	newOrder, newEvent := charge()
	if newOrder <= lostOrder || newEvent == lostEvent {
		t.Errorf("after the step: order %d, event %s; want an ID above %d and another event ID than %s", newOrder, newEvent, lostOrder, lostEvent)
	}
}
