package orders_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/orders"
	ordsqlite "github.com/idemkit/idem/internal/orders/sqlitestore"
	paysqlite "github.com/idemkit/idem/internal/payments/sqlitestore"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/saga"
)

// watchdogFixture is a SQLite database with the order stores, a saga and a
// watchdog whose orders are all past GiveUpAfter once they are an hour old.
type watchdogFixture struct {
	t   *testing.T
	drv *sqlitedriver.Driver
	ord *ordsqlite.Store
	wd  *orders.Watchdog[*sql.Tx]
	// offset is added to the watchdog's clock (shift).
	offset atomic.Int64
}

// shift sets the watchdog's clock to d after the real time.
func (f *watchdogFixture) shift(d time.Duration) { f.offset.Store(int64(d)) }

func newWatchdogFixture(t *testing.T, limit int) *watchdogFixture {
	t.Helper()
	return newWatchdogFixtureStarted(t, limit, 31*time.Minute)
}

// startedAgo is a watchdog clock (WatchdogConfig.Now) for a watchdog that
// started d ago: its first reading, NewWatchdog's, is d in the past.
func startedAgo(d time.Duration) func() time.Time {
	var read atomic.Bool
	return func() time.Time {
		if !read.Swap(true) {
			return time.Now().Add(-d)
		}
		return time.Now()
	}
}

// newWatchdogFixtureStarted is newWatchdogFixture with a watchdog that
// started ago (more than GiveUpAfter, 30 minutes: it may give up on
// orders at once; 0: it just started).
func newWatchdogFixtureStarted(t *testing.T, limit int, ago time.Duration) *watchdogFixture {
	t.Helper()
	drv, pay, ord := sqliteStores(t)
	sagas, err := saga.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
	f := &watchdogFixture{t: t, drv: drv, ord: ord}
	f.shift(-ago) // NewWatchdog reads its start
	wd, err := orders.NewWatchdog(drv, ps, ord, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute, Limit: limit,
		Now: func() time.Time { return time.Now().Add(time.Duration(f.offset.Load())) }},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f.shift(0)
	f.wd = wd
	return f
}

// order stores an order created an hour ago with its OrderCreated.v1 in
// the outbox, unpublished.
func (f *watchdogFixture) order() orders.Order {
	f.t.Helper()
	ctx := context.Background()
	tx, err := f.drv.Begin(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	o, err := f.ord.Create(ctx, tx, orders.NewOrder{CustomerID: 1, Amount: decimal.RequireFromString("5"), Items: []orders.Item{{SKU: "A", Quantity: 1}}})
	if err != nil {
		f.t.Fatal(err)
	}
	e, err := orders.CreatedEvent(o)
	if err != nil {
		f.t.Fatal(err)
	}
	hourAgo := time.Now().Add(-time.Hour)
	e.OccurredAt = hourAgo.UTC().Truncate(time.Microsecond)
	if err := outbox.EnqueueTx(ctx, f.drv, tx, e); err != nil {
		f.t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE customer_order SET created_at = ? WHERE id = ?`, orders.FormatTime(hourAgo), o.ID); err != nil {
		f.t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE outbox SET created_at = ? WHERE event_id = ?`, hourAgo.UnixMicro(), e.ID.String()); err != nil {
		f.t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		f.t.Fatal(err)
	}
	return o
}

// publishAll publishes the outbox (to nowhere: the events are "lost").
func (f *watchdogFixture) publishAll() {
	f.t.Helper()
	r, err := outbox.NewRelay(f.drv, outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil }),
		&outbox.RelayConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.t.Fatal(err)
	}
	for {
		n, err := r.RunOnce(context.Background())
		if err != nil {
			f.t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

func (f *watchdogFixture) status(id int64) string {
	f.t.Helper()
	var st string
	err := f.drv.DB().QueryRow(`SELECT state FROM saga WHERE saga_id = ?`, orders.SagaID(id)).Scan(&st)
	if err == sql.ErrNoRows {
		return "none"
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

// An order past GiveUpAfter whose OrderCreated.v1 was never published (the
// relay or Kafka is down) is late, not lost: the watchdog waits for it
// instead of rejecting the customer's order; once the event was published
// and still nothing moved, it gives up.
func TestWatchdogWaitsForUnpublishedEvents(t *testing.T) {
	t.Parallel()
	f := newWatchdogFixture(t, 0)
	o := f.order()
	st, err := f.wd.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Waiting != 1 || st.Aborted != 0 || f.status(o.ID) != "none" {
		t.Fatalf("round with the order's event unpublished: %+v, saga %s; want 1 waiting, nothing aborted", st, f.status(o.ID))
	}
	f.publishAll()
	f.shift(30*time.Minute + time.Second) // GiveUpAfter later (see TestWatchdogGivesTheConsumersTimeAfterAnOutage)
	if st, err = f.wd.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.Waiting != 0 || st.Aborted != 1 || f.status(o.ID) != string(saga.Compensating) {
		t.Errorf("round after the event was published (and lost): %+v, saga %s; want 1 aborted", st, f.status(o.ID))
	}
}

// An order whose saga was aborted is counted once: until the compensator
// REJECTs it, the order is still CREATED, and a later round (or another
// replica's watchdog) that finds its saga compensating already neither
// counts it as aborted again (idemd's
// idemd_order_watchdog_orders_total{action="aborted"}) nor logs it again.
func TestWatchdogCountsAnAbortOnce(t *testing.T) {
	t.Parallel()
	f := newWatchdogFixture(t, 0)
	o := f.order()
	f.publishAll()
	st, err := f.wd.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Aborted != 1 || f.status(o.ID) != string(saga.Compensating) {
		t.Fatalf("first round: %+v, saga %s; want 1 aborted", st, f.status(o.ID))
	}
	for round := 2; round <= 3; round++ {
		if st, err = f.wd.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st != (orders.WatchdogStats{}) {
			t.Errorf("round %d, the saga compensating already: %+v; want nothing counted", round, st)
		}
	}
}

// A round reads every page of stale orders: orders the watchdog cannot
// change (their payment was captured) do not starve the ones behind them.
func TestWatchdogReadsEveryPage(t *testing.T) {
	t.Parallel()
	f := newWatchdogFixture(t, 2)
	var ids []int64
	for range 5 {
		ids = append(ids, f.order().ID)
	}
	f.publishAll()
	st, err := f.wd.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Aborted != 5 {
		t.Errorf("one round with a page of 2: %+v; want the 5 orders aborted", st)
	}
	for _, id := range ids {
		if s := f.status(id); s != string(saga.Compensating) {
			t.Errorf("order %d: saga %s, want %s", id, s, saga.Compensating)
		}
	}
}

// listerFunc is an orders.StaleLister.
type listerFunc func(ctx context.Context, before time.Time, afterID int64, limit int) ([]orders.Stale, error)

func (f listerFunc) ListCreatedBefore(ctx context.Context, before time.Time, afterID int64, limit int) ([]orders.Stale, error) {
	return f(ctx, before, afterID, limit)
}

// An order that was still CREATED when a round listed it, and whose saga
// completed (the order CONFIRMED) before the watchdog looked at the saga,
// moved on: it is neither reported to an operator as stuck with a
// captured payment nor published again.
func TestWatchdogSkipsOrderThatMovedOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newWatchdogFixture(t, 0)
	o := f.order()
	f.publishAll()
	sagas, err := saga.New(f.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	pay := paysqlite.New(f.drv.DB())
	ps := orders.NewPaymentSaga(sagas, f.ord, pay, slog.New(slog.DiscardHandler))
	inTx := txRunner(t, f.drv)
	created, err := orders.CreatedEvent(o)
	if err != nil {
		t.Fatal(err)
	}
	// The consumer catches up right after the listing.
	lister := listerFunc(func(ctx context.Context, before time.Time, afterID int64, limit int) ([]orders.Stale, error) {
		stale, err := f.ord.ListCreatedBefore(ctx, before, afterID, limit)
		if err != nil || len(stale) == 0 {
			return stale, err
		}
		inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, created) })
		var captured event.Envelope
		if err := f.drv.DB().QueryRowContext(ctx, `SELECT payload FROM outbox WHERE event_type = ?`, orders.EventPaymentCaptured).Scan(&captured.Payload); err != nil {
			t.Fatal(err)
		}
		captured.Type = orders.EventPaymentCaptured
		inTx(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, captured) })
		return stale, nil
	})
	logs := &testlog.Buffer{}
	wd, err := orders.NewWatchdog(f.drv, ps, lister, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute,
		Now: startedAgo(31 * time.Minute)}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := wd.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := f.ord.Get(ctx, o.ID); err != nil || got.Status != orders.StatusConfirmed {
		t.Fatalf("order %+v, %v; want CONFIRMED", got, err)
	}
	if st != (orders.WatchdogStats{}) {
		t.Errorf("round: %+v; want nothing done (the order moved on)", st)
	}
	if strings.Contains(logs.String(), "level=ERROR") || strings.Contains(logs.String(), "operator") {
		t.Errorf("the confirmed order was reported:\n%s", logs)
	}
}

// A round that fails after it aborted sagas (a later page of the listing,
// or the redrive, fails: a database hiccup) still reports the aborts it
// committed, marked Partial: the next round finds those sagas compensating
// and does not count them again, so a round that reported nothing would
// lose them from idemd_order_watchdog_orders_total{action="aborted"} for
// good. Its gauges (Operator, Waiting) are partial counts, for OnRound to
// ignore.
func TestWatchdogReportsTheAbortsOfAFailedRound(t *testing.T) {
	t.Parallel()
	f := newWatchdogFixture(t, 1)
	first, second := f.order(), f.order()
	f.publishAll()
	sagas, err := saga.New(f.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, f.ord, paysqlite.New(f.drv.DB()), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	lister := listerFunc(func(ctx context.Context, before time.Time, afterID int64, limit int) ([]orders.Stale, error) {
		calls++
		switch calls {
		case 1: // round 1, page 1: the first order
			return f.ord.ListCreatedBefore(ctx, before, afterID, limit)
		case 2: // round 1, page 2
			return nil, errors.New("connection reset")
		}
		cancel() // round 2: stop
		return nil, context.Canceled
	})
	var reports []orders.WatchdogStats
	wd, err := orders.NewWatchdog(f.drv, ps, lister, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute,
		Limit: 1, Interval: time.Millisecond, Now: startedAgo(31 * time.Minute), OnRound: func(s orders.WatchdogStats) { reports = append(reports, s) }},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := wd.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if f.status(first.ID) != string(saga.Compensating) || f.status(second.ID) != "none" {
		t.Fatalf("sagas %s, %s; want the first aborted by round 1, the second untouched", f.status(first.ID), f.status(second.ID))
	}
	var aborted int
	for _, r := range reports {
		aborted += r.Aborted
		if !r.Partial {
			t.Errorf("report %+v of a failed round; want it Partial", r)
		}
	}
	if aborted != 1 {
		t.Errorf("reports %+v; want the failed round's abort reported once", reports)
	}
}

// The end of an outage (the relay or Kafka down for longer than
// GiveUpAfter, or idemd run with -kafka off for a while) publishes the
// backlog at once, orders older than GiveUpAfter included. Their events
// are late, not lost: the consumers need time to work through the backlog,
// and an order whose event they have not reached yet must not be REJECTED
// at the next round. The watchdog gives up on such an order only
// GiveUpAfter after it last saw its events waiting (or after it started:
// a backlog may be published before its first round).
func TestWatchdogGivesTheConsumersTimeAfterAnOutage(t *testing.T) {
	t.Parallel()
	f := newWatchdogFixture(t, 0)
	o := f.order()
	st, err := f.wd.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Waiting != 1 || f.status(o.ID) != "none" {
		t.Fatalf("round during the outage: %+v, saga %s; want 1 waiting", st, f.status(o.ID))
	}
	f.publishAll() // the outage ends: the consumers have not read the event yet
	f.shift(30 * time.Second)
	if st, err = f.wd.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.Aborted != 0 || st.Waiting != 1 || f.status(o.ID) != "none" {
		t.Fatalf("round 30s after the backlog was published: %+v, saga %s; want the order waited for, not aborted", st, f.status(o.ID))
	}
	f.shift(30*time.Minute + time.Second) // GiveUpAfter after the outage, still nothing moved: lost
	if st, err = f.wd.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.Aborted != 1 || f.status(o.ID) != string(saga.Compensating) {
		t.Errorf("round GiveUpAfter after the outage: %+v, saga %s; want 1 aborted", st, f.status(o.ID))
	}
}

// A watchdog that just started does not give up on an order at once: the
// backlog of an outage may have been published before its first round
// (idemd restarted after it, or started with Kafka after running without).
func TestWatchdogGivesTheConsumersTimeAfterItStarts(t *testing.T) {
	t.Parallel()
	f := newWatchdogFixtureStarted(t, 0, 0)
	o := f.order()
	f.publishAll()
	st, err := f.wd.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Aborted != 0 || st.Waiting != 1 || f.status(o.ID) != "none" {
		t.Fatalf("first round right after the start: %+v, saga %s; want the order waited for", st, f.status(o.ID))
	}
	f.shift(30*time.Minute + time.Second)
	if st, err = f.wd.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.Aborted != 1 {
		t.Errorf("round GiveUpAfter after the start: %+v; want 1 aborted", st)
	}
}

// While the watchdog gives the consumers time (after its start, or an
// outage), an order whose payment was captured is still reported to an
// operator: idemd_orders_needing_operator must not clear at every restart.
func TestWatchdogReportsChargedOrdersDuringItsGrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newWatchdogFixtureStarted(t, 0, 0)
	o := f.order()
	f.publishAll()
	sagas, err := saga.New(f.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, f.ord, paysqlite.New(f.drv.DB()), slog.New(slog.DiscardHandler))
	created, err := orders.CreatedEvent(o)
	if err != nil {
		t.Fatal(err)
	}
	txRunner(t, f.drv)(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, created) }) // charged; its PaymentCaptured.v1 lost
	st, err := f.wd.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Operator != 1 || st.Waiting != 0 || st.Aborted != 0 {
		t.Errorf("round right after the start, the order charged: %+v; want it reported to an operator", st)
	}
}

// An order whose payment was captured but which was never confirmed (its
// PaymentCaptured.v1 lost, or dead-lettered every time) is reported to an
// operator every round, and its events were published again every round
// for as long as it stayed so. Once the inboxes had forgotten its
// OrderCreated.v1 (their retention sweep, 72 h after they applied it), the
// next copy was applied again: the projection counted the order twice,
// and once more every 72 h. The watchdog publishes an order's events again
// only for RedriveFor after its creation.
func TestWatchdogRedrivesNoLongerThanTheInboxesRemember(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newWatchdogFixture(t, 0)
	sagas, err := saga.New(f.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, f.ord, paysqlite.New(f.drv.DB()), slog.New(slog.DiscardHandler))
	wd, err := orders.NewWatchdog(f.drv, ps, f.ord, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute,
		RedriveFor: 48 * time.Hour, Now: startedAgo(time.Hour)}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := orders.NewWatchdog(f.drv, ps, f.ord, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute,
		RedriveFor: time.Minute}, nil); err == nil {
		t.Error("NewWatchdog accepted a RedriveFor that is not above StuckAfter: nothing would ever be published again")
	}
	projection, err := inbox.New(f.drv, &inbox.Config{Consumer: "projection"})
	if err != nil {
		t.Fatal(err)
	}
	project := orders.Projection(f.ord)
	// deliver publishes the outbox and applies what it published to the
	// projection, through its inbox, as idemd's consumer does.
	deliver := func() (applied int) {
		t.Helper()
		var published []inbox.Event
		r, err := outbox.NewRelay(f.drv, outbox.PublisherFunc(func(_ context.Context, evs []event.Envelope) error {
			for _, e := range evs {
				published = append(published, inbox.Event{ID: e.ID, Payload: e})
			}
			return nil
		}), &outbox.RelayConfig{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		for {
			n, err := r.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
		res, err := projection.ProcessBatch(ctx, published, func(ctx context.Context, tx *sql.Tx, e inbox.Event) error {
			return project(ctx, tx, e.Payload.(event.Envelope))
		})
		if err != nil {
			t.Fatal(err)
		}
		return res.Applied
	}
	o := f.order()
	if n := deliver(); n != 1 {
		t.Fatalf("%d events applied to the projection, want its OrderCreated.v1", n)
	}
	created, err := orders.CreatedEvent(o)
	if err != nil {
		t.Fatal(err)
	}
	txRunner(t, f.drv)(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, created) }) // charged
	f.publishAll()                                                                    // its PaymentCaptured.v1 is lost

	// 73 hours later: the order is still CREATED, and the inboxes' sweep
	// forgot what they applied 72 h ago.
	if _, err := f.drv.DB().ExecContext(ctx, `UPDATE customer_order SET created_at = ? WHERE id = ?`,
		orders.FormatTime(time.Now().Add(-73*time.Hour)), o.ID); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(72*time.Hour + time.Minute)
	sweep, err := cleanup.New(f.drv, &cleanup.Config{Now: func() time.Time { return later }, Logger: slog.New(slog.DiscardHandler),
		Records: cleanup.RecordRetention{Disabled: true}, Outbox: cleanup.OutboxRetention{Disabled: true},
		Sagas: cleanup.SagaRetention{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := sweep.RunOnce(ctx); err != nil {
		t.Fatal(err)
	} else if rep.Deleted("processed_event") == 0 {
		t.Fatalf("the sweep deleted nothing: %+v", rep)
	}

	st, err := wd.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Operator != 1 {
		t.Errorf("round: %+v, want the charged order reported to an operator", st)
	}
	deliver()
	sum, err := f.ord.Summary(ctx, o.CustomerID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Redriven != 0 || sum.Orders != 1 {
		t.Errorf("an order 73 h old: %d events published again, the projection counts %d orders; want none published again, 1 order",
			st.Redriven, sum.Orders)
	}
}

// A saga aborted (by the watchdog, or by the saga itself) whose
// compensation does not finish (the compensator keeps failing on a
// database fault, or is hung on a connection that stopped answering)
// leaves its order CREATED with the saga Compensating for ever. The
// watchdog, which used to count it as "aborting, waiting for the
// compensator" round after round, reports it to an operator (log and
// gauge) once it finds it still compensating a round (Interval) after it
// first saw it so; not before: the compensator normally finishes in
// seconds.
func TestWatchdogReportsASagaStuckCompensating(t *testing.T) {
	t.Parallel()
	drv, pay, ord := sqliteStores(t)
	sagas, err := saga.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
	f := &watchdogFixture{t: t, drv: drv, ord: ord}
	logs := &testlog.Buffer{}
	f.shift(-31 * time.Minute)
	wd, err := orders.NewWatchdog(drv, ps, ord, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute, Interval: 30 * time.Second,
		Now: func() time.Time { return time.Now().Add(time.Duration(f.offset.Load())) }},
		slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f.shift(0)
	o := f.order()
	f.publishAll()
	ctx := context.Background()
	st, err := wd.RunOnce(ctx)
	if err != nil || st.Aborted != 1 {
		t.Fatalf("round 1: %+v, %v; want the saga aborted", st, err)
	}
	// No compensation finishes: the saga stays compensating.
	f.shift(10 * time.Second)
	if st, err = wd.RunOnce(ctx); err != nil || st.Operator != 0 {
		t.Errorf("round 10 s after the abort: %+v, %v; want nothing reported yet", st, err)
	}
	f.shift(31 * time.Second)
	if st, err = wd.RunOnce(ctx); err != nil || st.Operator != 1 {
		t.Errorf("round 31 s after the abort, still compensating: %+v, %v; want it reported to an operator", st, err)
	}
	if !strings.Contains(logs.String(), "still compensating") || !strings.Contains(logs.String(), orders.SagaID(o.ID)) {
		t.Errorf("no ERROR naming the saga stuck compensating in the logs:\n%s", logs)
	}
	// Compensated at last: nothing to report.
	if _, err := ps.Recover(ctx, orders.RecoverBatch); err != nil {
		t.Fatal(err)
	}
	f.shift(time.Minute)
	if st, err = wd.RunOnce(ctx); err != nil || st != (orders.WatchdogStats{}) {
		t.Errorf("round after the compensation: %+v, %v; want nothing", st, err)
	}
}

// The watchdog's ERROR for an order whose saga failed tells the operator
// how often the compensator tries that saga again: FailedRetryInterval
// (once a minute), not "every round" (every 30 s), as it did before the
// compensator's retries of Failed sagas were spaced out.
func TestWatchdogSaysHowOftenAFailedSagaIsRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv, pay, ord := sqliteStores(t)
	sagas, err := saga.New(drv, &saga.Config{CompensationBackoff: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.DiscardHandler))
	f := &watchdogFixture{t: t, drv: drv, ord: ord}
	o := f.order()
	f.publishAll()
	// Declined (over the limit) and aborted; its compensation fails on
	// every attempt while the order table is away: the saga is Failed.
	if _, err := drv.DB().ExecContext(ctx, `UPDATE customer_order SET amount = '10000.0001' WHERE id = ?`, o.ID); err != nil {
		t.Fatal(err)
	}
	o.Amount = decimal.RequireFromString("10000.0001")
	e, err := orders.CreatedEvent(o)
	if err != nil {
		t.Fatal(err)
	}
	txRunner(t, drv)(func(tx *sql.Tx) error { return ps.Handle(ctx, tx, e) })
	if _, err := drv.DB().ExecContext(ctx, `ALTER TABLE customer_order RENAME TO customer_order_away`); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Recover(ctx, orders.RecoverBatch); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.DB().ExecContext(ctx, `ALTER TABLE customer_order_away RENAME TO customer_order`); err != nil {
		t.Fatal(err)
	}
	if s, err := sagas.Get(ctx, orders.SagaID(o.ID)); err != nil || s.State != saga.Failed {
		t.Fatalf("saga %+v, %v; want Failed", s, err)
	}
	logs := &testlog.Buffer{}
	wd, err := orders.NewWatchdog(drv, ps, ord, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute,
		Interval: 30 * time.Second, Now: startedAgo(time.Hour)}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := wd.RunOnce(ctx); err != nil || st.Operator != 1 {
		t.Fatalf("round: %+v, %v; want the order with a failed saga reported to an operator", st, err)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "its saga failed") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no ERROR about the failed saga in the logs:\n%s", logs)
	}
	if want := "every " + orders.FailedRetryInterval.String(); !strings.Contains(line, want) || strings.Contains(line, "every round") {
		t.Errorf("the ERROR says how often the compensator retries the saga wrongly; want %q:\n%s", want, line)
	}
}
