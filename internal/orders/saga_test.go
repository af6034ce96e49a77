package orders_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/orders"
	ordsqlite "github.com/idemkit/idem/internal/orders/sqlitestore"
	"github.com/idemkit/idem/internal/payments"
	paysqlite "github.com/idemkit/idem/internal/payments/sqlitestore"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/saga"
)

// A saga that can never be compensated (its charge completed, and idemd
// has no refunds) is Failed for an operator: the compensator logs it when
// it fails, then leaves it alone instead of flipping it back to
// Compensating and warning about it every few seconds, forever.
func TestRecoverLeavesUncompensableFailedSaga(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, pay, ord := sqliteStores(t)
	sagas, err := saga.New(drv, &saga.Config{CompensationBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.NewTextHandler(logs, nil)))
	inTx := txRunner(t, drv)
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
	inTx(func(tx *sql.Tx) error { return sagas.AbortTx(ctx, tx, id) })
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

// The saga's outcomes: the confirm-order step emits OrderConfirmed.v1 and
// the compensation of place-order OrderRejected.v1, each in its
// transaction, keyed by the order ID, with an ID derived from the saga and
// the step; the saga ignores both; its payment is CAPTURED.
func TestSagaEmitsOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, pay, ord, _, ps := sagaFixture(t)
	handle := func(e event.Envelope) {
		t.Helper()
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := ps.Handle(ctx, tx, e); err != nil {
			_ = tx.Rollback()
			t.Fatalf("Handle %s: %v", e.Type, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	newOrder := func(customer int64, amount string) (orders.Order, event.Envelope) {
		t.Helper()
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		o, err := ord.Create(ctx, tx, orders.NewOrder{CustomerID: customer, Amount: decimal.RequireFromString(amount), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		e, err := orders.CreatedEvent(o)
		if err != nil {
			t.Fatal(err)
		}
		return o, e
	}
	// outbox returns the stored events of type typ.
	outbox := func(typ string) []event.Envelope {
		t.Helper()
		rows, err := drv.DB().QueryContext(ctx, `SELECT event_id, record_key, COALESCE(saga_id, ''), payload FROM outbox WHERE event_type = ? ORDER BY id`, typ)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []event.Envelope
		for rows.Next() {
			var (
				e  event.Envelope
				id string
			)
			if err := rows.Scan(&id, &e.Key, &e.SagaID, &e.Payload); err != nil {
				t.Fatal(err)
			}
			e.ID, e.Type = uuid.MustParse(id), typ
			out = append(out, e)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}

	ok, created := newOrder(7, "12.5")
	handle(created)
	captured := outbox(orders.EventPaymentCaptured)
	if len(captured) != 1 {
		t.Fatalf("%d PaymentCaptured.v1, want 1", len(captured))
	}
	captured[0].Type = orders.EventPaymentCaptured
	handle(captured[0])
	handle(captured[0]) // the saga completed: a no-op
	got, err := ord.Get(ctx, ok.ID)
	if err != nil || got.Status != orders.StatusConfirmed {
		t.Fatalf("order %+v, %v; want CONFIRMED", got, err)
	}
	if p, err := pay.Get(ctx, got.PaymentID); err != nil || p.Status != "CAPTURED" {
		t.Errorf("payment %+v, %v; want CAPTURED", p, err)
	}
	confirmed := outbox(orders.EventOrderConfirmed)
	wantPayload := fmt.Sprintf(`{"order_id":%d,"customer_id":7,"amount":"12.5000"}`, ok.ID)
	if len(confirmed) != 1 || confirmed[0].ID != saga.EventID(orders.SagaID(ok.ID), orders.StepConfirm, "") ||
		confirmed[0].Key != strconv.FormatInt(ok.ID, 10) || confirmed[0].SagaID != orders.SagaID(ok.ID) || string(confirmed[0].Payload) != wantPayload {
		t.Errorf("OrderConfirmed.v1 %+v (payload %s), want one with payload %s", confirmed, payloads(confirmed), wantPayload)
	}

	big, created := newOrder(8, "10000.0001")
	handle(created)
	for range 2 { // the second: nothing left to compensate
		if _, err := ps.Recover(ctx, orders.RecoverBatch); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := ord.Get(ctx, big.ID); err != nil || got.Status != orders.StatusRejected {
		t.Fatalf("order %+v, %v; want REJECTED", got, err)
	}
	rejected := outbox(orders.EventOrderRejected)
	wantPayload = fmt.Sprintf(`{"order_id":%d,"customer_id":8,"amount":"10000.0001"}`, big.ID)
	if len(rejected) != 1 || rejected[0].ID != saga.EventID(orders.SagaID(big.ID), saga.CompensationName(orders.StepPlace), "") ||
		rejected[0].Key != strconv.FormatInt(big.ID, 10) || string(rejected[0].Payload) != wantPayload {
		t.Errorf("OrderRejected.v1 %+v (payload %s), want one with payload %s", rejected, payloads(rejected), wantPayload)
	}

	// The saga ignores its own outcomes.
	for _, e := range append(confirmed, rejected...) {
		e.Type = orders.EventOrderConfirmed
		if e.Key == strconv.FormatInt(big.ID, 10) {
			e.Type = orders.EventOrderRejected
		}
		handle(e)
	}
	if n := len(outbox(orders.EventOrderConfirmed)) + len(outbox(orders.EventOrderRejected)) + len(outbox(orders.EventPaymentCaptured)); n != 3 {
		t.Errorf("%d events after the no-ops, want 3", n)
	}
}

func payloads(evs []event.Envelope) string {
	var b strings.Builder
	for _, e := range evs {
		b.Write(e.Payload)
		b.WriteByte(' ')
	}
	return b.String()
}

// A payment found under the saga's (provider, external payment id) that is
// not this order's charge (other amount, customer or status: a hand-made
// row) is never taken for it: the event is poison, nothing commits, and
// the order is not confirmed.
func TestSagaRefusesForeignCharge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, pay, ord := sqliteStores(t)
	sagas, err := saga.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
	inTx := func(f func(tx *sql.Tx) error) error {
		t.Helper()
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := f(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	for i, foreign := range []payments.NewPayment{
		{Amount: decimal.RequireFromString("0.01"), CustomerID: 7, Status: payments.StatusCaptured},
		{Amount: decimal.RequireFromString("500"), CustomerID: 999, Status: payments.StatusCaptured},
		{Amount: decimal.RequireFromString("500"), CustomerID: 7, Status: payments.StatusPending},
	} {
		var o orders.Order
		if err := inTx(func(tx *sql.Tx) (err error) {
			o, err = ord.Create(ctx, tx, orders.NewOrder{CustomerID: 7, Amount: decimal.RequireFromString("500"), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		foreign.Provider, foreign.ExternalID = orders.SagaProvider, orders.SagaID(o.ID)
		if err := inTx(func(tx *sql.Tx) error { _, _, err := pay.CreateOrGet(ctx, tx, foreign); return err }); err != nil {
			t.Fatal(err)
		}
		e, err := orders.CreatedEvent(o)
		if err != nil {
			t.Fatal(err)
		}
		err = inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, e) })
		if !errors.Is(err, event.ErrPoison) || !strings.Contains(err.Error(), "not this order's charge") {
			t.Errorf("case %d: Handle: %v; want poison, not this order's charge", i, err)
		}
		if got, err := ord.Get(ctx, o.ID); err != nil || got.Status != orders.StatusCreated || got.PaymentID != 0 {
			t.Errorf("case %d: order %+v, %v; want CREATED without a payment", i, got, err)
		}
	}
	var n int
	if err := drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE event_type = ?`, orders.EventPaymentCaptured).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d PaymentCaptured events (%v), want 0", n, err)
	}
}

// A copy of OrderCreated.v1 delivered after the retention sweep deleted
// the finished saga (and the inbox forgot the event: a consumer group reset
// on a topic that keeps events for longer) changes nothing: it neither
// charges a rejected order nor confirms a confirmed one again.
func TestSagaLateCreatedAfterSagaDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, _, ord, sagas, ps := sagaFixture(t)
	inTx := txRunner(t, drv)
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := drv.DB().QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	newOrder := func(customer int64, amount string) (o orders.Order, e event.Envelope) {
		t.Helper()
		inTx(func(tx *sql.Tx) (err error) {
			o, err = ord.Create(ctx, tx, orders.NewOrder{CustomerID: customer, Amount: decimal.RequireFromString(amount), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
			return err
		})
		e, err := orders.CreatedEvent(o)
		if err != nil {
			t.Fatal(err)
		}
		return o, e
	}

	// Rejected: above the payment limit, aborted, compensated.
	rej, rejCreated := newOrder(8, "10000.0001")
	inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, rejCreated) })
	if _, err := ps.Recover(ctx, orders.RecoverBatch); err != nil {
		t.Fatal(err)
	}
	// Confirmed: charged, then PaymentCaptured.v1 confirms it.
	okOrder, okCreated := newOrder(7, "12.5")
	inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, okCreated) })
	var captured event.Envelope
	var capID string
	if err := drv.DB().QueryRowContext(ctx, `SELECT event_id, payload FROM outbox WHERE event_type = ?`, orders.EventPaymentCaptured).Scan(&capID, &captured.Payload); err != nil {
		t.Fatal(err)
	}
	captured.ID, captured.Type = uuid.MustParse(capID), orders.EventPaymentCaptured
	inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, captured) })
	for _, o := range []struct {
		id   int64
		want string
	}{{rej.ID, orders.StatusRejected}, {okOrder.ID, orders.StatusConfirmed}} {
		if got, err := ord.Get(ctx, o.id); err != nil || got.Status != o.want {
			t.Fatalf("order %d: %+v, %v; want %s", o.id, got, err, o.want)
		}
	}
	// Rejected under the limit (the watchdog gave up on it), its saga
	// already deleted.
	gaveUp, gaveUpCreated := newOrder(9, "5")
	inTx(func(tx *sql.Tx) error { return ord.SetStatus(ctx, tx, gaveUp.ID, orders.StatusRejected) })
	events, payments := count(`SELECT count(*) FROM outbox`), count(`SELECT count(*) FROM payment`)

	// The retention sweep deletes both finished sagas.
	if n, err := saga.DeleteFinished(ctx, drv.Sagas(), time.Now().Add(100*time.Hour), 100); err != nil || n != 2 {
		t.Fatalf("DeleteFinished: %d, %v; want 2", n, err)
	}
	for _, e := range []event.Envelope{rejCreated, okCreated, captured, gaveUpCreated} {
		inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, e) })
	}
	for _, o := range []struct {
		id   int64
		want string
	}{{rej.ID, orders.StatusRejected}, {okOrder.ID, orders.StatusConfirmed}, {gaveUp.ID, orders.StatusRejected}} {
		if got, err := ord.Get(ctx, o.id); err != nil || got.Status != o.want {
			t.Errorf("order %d after the late copies: %+v, %v; want %s", o.id, got, err, o.want)
		}
		if _, err := sagas.Get(ctx, orders.SagaID(o.id)); !errors.Is(err, saga.ErrNotFound) {
			t.Errorf("order %d: a saga was started again (%v)", o.id, err)
		}
	}
	if n := count(`SELECT count(*) FROM payment`); n != payments {
		t.Errorf("%d payments after the late copies, want %d (a rejected order charged)", n, payments)
	}
	if n := count(`SELECT count(*) FROM outbox`); n != events {
		t.Errorf("%d events in the outbox after the late copies, want %d", n, events)
	}
}

// Failed sagas left to an operator never change, so they stay the least
// recently updated; once a page of them is waiting, a Failed saga that can
// still be compensated must not be starved: Recover pages through them.
func TestRecoverPagesPastUncompensableSagas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, _, ord, sagas, ps := sagaFixture(t)
	// Every Recover finds FailedRetryInterval passed: each goes through
	// a page of Failed sagas.
	var rounds atomic.Int64
	start := time.Now()
	orders.SetClock(ps, func() time.Time { return start.Add(time.Duration(rounds.Add(1)) * orders.FailedRetryInterval) })
	inTx := txRunner(t, drv)
	handleNew := func(amount string) orders.Order {
		t.Helper()
		var o orders.Order
		inTx(func(tx *sql.Tx) (err error) {
			o, err = ord.Create(ctx, tx, orders.NewOrder{CustomerID: 1, Amount: decimal.RequireFromString(amount), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
			return err
		})
		e, err := orders.CreatedEvent(o)
		if err != nil {
			t.Fatal(err)
		}
		inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, e) })
		return o
	}
	const page = 3
	// A page of sagas charged, then aborted: Failed for good.
	for range page {
		o := handleNew("5")
		inTx(func(tx *sql.Tx) error { return sagas.AbortTx(ctx, tx, orders.SagaID(o.ID)) })
	}
	if _, err := ps.Recover(ctx, page); err != nil {
		t.Fatal(err)
	}
	// Then one whose compensation fails once (its table is away), and
	// could succeed on the next attempt.
	later := handleNew("10000.0001") // above the limit: aborted before its charge
	if _, err := drv.DB().ExecContext(ctx, `ALTER TABLE customer_order RENAME TO customer_order_away`); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Recover(ctx, page); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.DB().ExecContext(ctx, `ALTER TABLE customer_order_away RENAME TO customer_order`); err != nil {
		t.Fatal(err)
	}
	if s, err := sagas.Get(ctx, orders.SagaID(later.ID)); err != nil || s.State != saga.Failed {
		t.Fatalf("saga %+v, %v; want Failed", s, err)
	}
	for range 3 {
		if _, err := ps.Recover(ctx, page); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := sagas.Get(ctx, orders.SagaID(later.ID)); err != nil || s.State != saga.Compensated {
		t.Errorf("saga %v, %v; want Compensated", s.State, err)
	}
	if o, err := ord.Get(ctx, later.ID); err != nil || o.Status != orders.StatusRejected {
		t.Errorf("order %+v, %v; want REJECTED", o, err)
	}
}

// sagaFixture returns a migrated SQLite database with the stores, a saga
// coordinator (compensations retried at once) and the order saga on them.
func sagaFixture(t *testing.T) (*sqlitedriver.Driver, *paysqlite.Store, *ordsqlite.Store, *saga.Coordinator[*sql.Tx], *orders.PaymentSaga[*sql.Tx]) {
	t.Helper()
	drv, pay, ord := sqliteStores(t)
	sagas, err := saga.New(drv, &saga.Config{CompensationBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return drv, pay, ord, sagas, orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
}

// txRunner returns a function that runs fn in a transaction of drv and
// commits it, failing the test on any error.
func txRunner(t *testing.T, drv *sqlitedriver.Driver) func(fn func(tx *sql.Tx) error) {
	return func(fn func(tx *sql.Tx) error) {
		t.Helper()
		ctx := context.Background()
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
}

// sqliteStores returns a migrated SQLite database with the payment and
// order stores on it.
func sqliteStores(t *testing.T) (*sqlitedriver.Driver, *paysqlite.Store, *ordsqlite.Store) {
	t.Helper()
	drv := testdb.SQLite(t)
	pay, ord := paysqlite.New(drv.DB()), ordsqlite.New(drv.DB())
	for _, m := range []func(context.Context) error{pay.Migrate, ord.Migrate} {
		if err := m(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return drv, pay, ord
}

// A Failed saga whose compensation keeps failing is tried again at most
// once per FailedRetryInterval, not by every Recover: RunCompensator runs
// one after every consumer batch that applied an event, so under steady
// traffic every failing saga was compensated again, CompensationAttempts
// attempts and their warnings each time, back to back, for ever. Once the
// interval passed, the saga is tried again and compensated.
func TestRecoverRetriesAFailedSagaAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, pay, ord := sqliteStores(t)
	logs := &testlog.Buffer{}
	sagas, err := saga.New(drv, &saga.Config{CompensationBackoff: time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
	var clock atomic.Int64
	start := time.Now()
	orders.SetClock(ps, func() time.Time { return start.Add(time.Duration(clock.Load())) })
	inTx := txRunner(t, drv)
	var o orders.Order
	inTx(func(tx *sql.Tx) (err error) {
		o, err = ord.Create(ctx, tx, orders.NewOrder{CustomerID: 1, Amount: decimal.RequireFromString("10000.0001"), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
		return err
	})
	e, err := orders.CreatedEvent(o)
	if err != nil {
		t.Fatal(err)
	}
	inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, e) }) // above the limit: aborted
	// Its compensation fails on every attempt while the table is away.
	if _, err := drv.DB().ExecContext(ctx, `ALTER TABLE customer_order RENAME TO customer_order_away`); err != nil {
		t.Fatal(err)
	}
	attempts := func() int { return strings.Count(logs.String(), "saga: compensation failed") }
	if _, err := ps.Recover(ctx, orders.RecoverBatch); err != nil {
		t.Fatal(err)
	}
	if s, err := sagas.Get(ctx, orders.SagaID(o.ID)); err != nil || s.State != saga.Failed {
		t.Fatalf("saga %+v, %v; want Failed", s, err)
	}
	first := attempts()
	for range 10 { // ten consumer batches' wakes, within a second
		if _, err := ps.Recover(ctx, orders.RecoverBatch); err != nil {
			t.Fatal(err)
		}
	}
	if n := attempts() - first; n != 0 {
		t.Errorf("10 Recovers right after the saga failed made %d more attempts of its compensation; want 0 before %s", n, orders.FailedRetryInterval)
	}
	if _, err := drv.DB().ExecContext(ctx, `ALTER TABLE customer_order_away RENAME TO customer_order`); err != nil {
		t.Fatal(err)
	}
	clock.Store(int64(orders.FailedRetryInterval))
	if _, err := ps.Recover(ctx, orders.RecoverBatch); err != nil {
		t.Fatal(err)
	}
	if s, err := sagas.Get(ctx, orders.SagaID(o.ID)); err != nil || s.State != saga.Compensated {
		t.Errorf("saga %v, %v after the interval; want Compensated", s.State, err)
	}
}

// An event of a type the saga acts on, in a version it does not know (a
// newer producer's OrderCreated.v2 reaching a replica not yet upgraded, in
// a rolling deploy), is poison: dead-lettered, so that it is neither
// applied as a no-op (the inbox would record it, and the upgraded
// consumer would never see it: no saga, no charge) nor retried for ever.
// Types it does not act on, in any version, are no-ops.
func TestSagaDeadLettersUnknownVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, _, ord, _, ps := sagaFixture(t)
	inTx := txRunner(t, drv)
	var o orders.Order
	inTx(func(tx *sql.Tx) (err error) {
		o, err = ord.Create(ctx, tx, orders.NewOrder{CustomerID: 7, Amount: decimal.RequireFromString("5"), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
		return err
	})
	created, err := orders.CreatedEvent(o)
	if err != nil {
		t.Fatal(err)
	}
	handle := func(typ string) error {
		e := created
		e.Type = typ
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		return ps.Handle(ctx, tx, e)
	}
	for _, typ := range []string{"OrderCreated.v2", "OrderCreated.v0", "PaymentCaptured.v2"} {
		if err := handle(typ); !errors.Is(err, event.ErrPoison) {
			t.Errorf("%s: %v, want ErrPoison", typ, err)
		}
	}
	for _, typ := range []string{"OrderShipped.v1", "OrderConfirmed.v2", "OrderRejected.v3", "payments.OrderCreated.v2"} {
		if err := handle(typ); err != nil {
			t.Errorf("%s: %v, want nil (not a type the saga acts on)", typ, err)
		}
	}
}
