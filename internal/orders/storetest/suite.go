package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/orders"
)

// Harness is one store on a fresh, migrated database.
type Harness[TTx any] struct {
	Store orders.Store[TTx]
	// Driver begins and ends the transactions the store writes in.
	Driver driver.Driver[TTx]
}

// Run runs the suite; open returns a harness on a fresh database each time.
func Run[TTx any](t *testing.T, open func(t *testing.T) Harness[TTx]) {
	t.Helper()
	tests := map[string]func(*testing.T, Harness[TTx]){
		"CreateThenGet":         testCreateThenGet[TTx],
		"NotFound":              testNotFound[TTx],
		"RollbackLeavesNothing": testRollbackLeavesNothing[TTx],
		"SummaryAddsExactly":    testSummaryAddsExactly[TTx],
		"ProjectionIgnores":     testProjectionIgnores[TTx],
		"ProjectionCommutes":    testProjectionCommutes[TTx],
		"ConcurrentApplies":     testConcurrentApplies[TTx],
		"SetStatusAndPayment":   testSetStatusAndPayment[TTx],
		"ListCreatedBefore":     testListCreatedBefore[TTx],
		"NonPositiveAmount":     testNonPositiveAmount[TTx],
	}
	for name, test := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, open(t))
		})
	}
}

// inTx runs f in a transaction of its own, committed if f succeeds.
func inTx[TTx any](ctx context.Context, h Harness[TTx], f func(tx TTx) error) error {
	tx, err := h.Driver.Begin(ctx)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = h.Driver.Rollback(ctx, tx)
		return err
	}
	return h.Driver.Commit(ctx, tx)
}

func create[TTx any](t *testing.T, h Harness[TTx], customer int64, amount string) orders.Order {
	t.Helper()
	var o orders.Order
	err := inTx(context.Background(), h, func(tx TTx) (err error) {
		o, err = h.Store.Create(context.Background(), tx, orders.NewOrder{
			CustomerID: customer,
			Amount:     decimal.RequireFromString(amount),
			Items:      []orders.Item{{SKU: "A-1", Quantity: 2}, {SKU: "B-2", Quantity: 1}},
		})
		return err
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return o
}

// apply applies, in a transaction of its own, the creation of order of
// customer and, if amount is not "", its confirmation with amount.
func apply[TTx any](ctx context.Context, h Harness[TTx], order, customer int64, amount string) error {
	d := orders.SummaryDelta{CustomerID: customer, Orders: 1, LastOrderID: order}
	if amount != "" {
		d.Confirmed, d.ConfirmedAmount = 1, decimal.RequireFromString(amount)
	}
	return inTx(ctx, h, func(tx TTx) error { return h.Store.Apply(ctx, tx, []orders.SummaryDelta{d}) })
}

// project applies events with orders.ProjectionBatch, in a transaction of
// its own.
func project[TTx any](t *testing.T, h Harness[TTx], events ...event.Envelope) {
	t.Helper()
	ctx := context.Background()
	if err := inTx(ctx, h, func(tx TTx) error { return orders.ProjectionBatch(h.Store)(ctx, tx, events) }); err != nil {
		t.Fatalf("project %d events: %v", len(events), err)
	}
}

// orderEvents returns the OrderCreated.v1 of o and its outcome event typ
// (EventOrderConfirmed or EventOrderRejected).
func orderEvents(t *testing.T, o orders.Order, typ string) (created, outcome event.Envelope) {
	t.Helper()
	created, err := orders.CreatedEvent(o)
	if err == nil {
		outcome, err = orders.OutcomeEvent(typ, o)
	}
	if err != nil {
		t.Fatal(err)
	}
	return created, outcome
}

// summaryString formats what a summary shows.
func summaryString(s orders.Summary) string {
	return fmt.Sprintf("customer %d: orders %d pending %d confirmed %d rejected %d total %s last %d",
		s.CustomerID, s.Orders, s.Pending(), s.Confirmed, s.Rejected, s.TotalAmount.StringFixed(4), s.LastOrderID)
}

func summary[TTx any](t *testing.T, h Harness[TTx], customer int64) orders.Summary {
	t.Helper()
	s, err := h.Store.Summary(context.Background(), customer)
	if err != nil {
		t.Fatalf("Summary(%d): %v", customer, err)
	}
	return s
}

func testCreateThenGet[TTx any](t *testing.T, h Harness[TTx]) {
	before := time.Now().Add(-time.Second)
	o := create(t, h, 42, "19.90")
	if o.ID <= 0 || o.CustomerID != 42 || o.Status != orders.StatusCreated || len(o.Items) != 2 ||
		o.Amount.StringFixed(4) != "19.9000" || o.CreatedAt.Before(before) || o.CreatedAt.Location() != time.UTC {
		t.Fatalf("created %+v", o)
	}
	got, err := h.Store.Get(context.Background(), o.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if fmt.Sprint(got) != fmt.Sprint(o) {
		t.Errorf("Get = %+v, want %+v", got, o)
	}
	if o2 := create(t, h, 42, "0.0001"); o2.ID <= o.ID {
		t.Errorf("second id %d after %d", o2.ID, o.ID)
	}
}

func testNotFound[TTx any](t *testing.T, h Harness[TTx]) {
	if _, err := h.Store.Get(context.Background(), 1<<62); !errors.Is(err, orders.ErrNotFound) {
		t.Errorf("Get: %v, want ErrNotFound", err)
	}
	if _, err := h.Store.Summary(context.Background(), 7); !errors.Is(err, orders.ErrNotFound) {
		t.Errorf("Summary: %v, want ErrNotFound", err)
	}
}

func testRollbackLeavesNothing[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	var id int64
	boom := errors.New("boom")
	err := inTx(ctx, h, func(tx TTx) error {
		o, err := h.Store.Create(ctx, tx, orders.NewOrder{CustomerID: 1, Amount: decimal.RequireFromString("1"), Items: []orders.Item{{SKU: "x", Quantity: 1}}})
		if err != nil {
			return err
		}
		id = o.ID
		if err := h.Store.Apply(ctx, tx, []orders.SummaryDelta{{CustomerID: 1, Orders: 1, LastOrderID: o.ID}}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("inTx: %v", err)
	}
	if _, err := h.Store.Get(ctx, id); !errors.Is(err, orders.ErrNotFound) {
		t.Errorf("rolled back order: %v", err)
	}
	if _, err := h.Store.Summary(ctx, 1); !errors.Is(err, orders.ErrNotFound) {
		t.Errorf("rolled back summary: %v", err)
	}
}

func testSummaryAddsExactly[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	for i, a := range []string{"0.1000", "0.2000", "999999999999999.9999", "0.0001"} {
		if err := apply(ctx, h, int64(10-i), 5, a); err != nil { // order ids decrease: last_order_id keeps the max
			t.Fatal(err)
		}
	}
	if err := apply(ctx, h, 3, 6, "19.9000"); err != nil {
		t.Fatal(err)
	}
	if err := apply(ctx, h, 11, 6, ""); err != nil { // created, not confirmed
		t.Fatal(err)
	}
	s := summary(t, h, 5)
	if s.CustomerID != 5 || s.Orders != 4 || s.Confirmed != 4 || s.Pending() != 0 ||
		s.TotalAmount.StringFixed(4) != "1000000000000000.3000" || s.LastOrderID != 10 || s.UpdatedAt.IsZero() {
		t.Errorf("summary %+v (total %s)", s, s.TotalAmount)
	}
	if s := summary(t, h, 6); s.Orders != 2 || s.Confirmed != 1 || s.Pending() != 1 || s.TotalAmount.StringFixed(4) != "19.9000" || s.LastOrderID != 11 {
		t.Errorf("summary %+v", s)
	}
	// Several customers in one call, in any order of the slice; a
	// customer with no order yet gets a row with zero orders.
	if err := inTx(ctx, h, func(tx TTx) error {
		return h.Store.Apply(ctx, tx, []orders.SummaryDelta{
			{CustomerID: 8, Rejected: 1, LastOrderID: 20},
			{CustomerID: 6, Rejected: 1, LastOrderID: 11},
			{CustomerID: 7, Confirmed: 2, ConfirmedAmount: decimal.RequireFromString("0.0002"), LastOrderID: 21},
		})
	}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"customer 6: orders 2 pending 0 confirmed 1 rejected 1 total 19.9000 last 11",
		"customer 7: orders 0 pending 0 confirmed 2 rejected 0 total 0.0002 last 21",
		"customer 8: orders 0 pending 0 confirmed 0 rejected 1 total 0.0000 last 20",
	} {
		var c int64
		_, _ = fmt.Sscanf(want, "customer %d:", &c)
		if got := summaryString(summary(t, h, c)); got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	}
}

func testProjectionIgnores[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	project := orders.Projection(h.Store)
	o := create(t, h, 77, "2.5")
	created, confirmed := orderEvents(t, o, orders.EventOrderConfirmed)
	other, err := event.New("OrderShipped.v1", "1", map[string]int{"order_id": 1})
	if err != nil {
		t.Fatal(err)
	}
	captured, err := event.New(orders.EventPaymentCaptured, "1", orders.PaymentCaptured{OrderID: o.ID, PaymentID: 1, CustomerID: 77, Amount: "2.5000"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []event.Envelope{created, other, captured, confirmed} {
		if err := inTx(ctx, h, func(tx TTx) error { return project(ctx, tx, e) }); err != nil {
			t.Fatalf("project %s: %v", e.Type, err)
		}
	}
	if s := summary(t, h, 77); s.Orders != 1 || s.Confirmed != 1 || s.TotalAmount.StringFixed(4) != "2.5000" || s.LastOrderID != o.ID {
		t.Errorf("summary %+v", s)
	}
	// Only unknown types are ignored: a batch of them changes nothing.
	if err := inTx(ctx, h, func(tx TTx) error {
		return orders.ProjectionBatch(h.Store)(ctx, tx, []event.Envelope{other, captured})
	}); err != nil {
		t.Fatal(err)
	}
	for _, e := range []event.Envelope{created, confirmed} {
		for _, payload := range []string{`{"order_id":"x"}`, `{"order_id":1,"customer_id":77,"amount":"-1"}`, `{"order_id":1,"amount":"1"}`} {
			bad := e
			bad.Payload = []byte(payload)
			err := inTx(ctx, h, func(tx TTx) error { return project(ctx, tx, bad) })
			if !errors.Is(err, idemkafka.ErrPoison) {
				t.Errorf("%s %s: %v, want ErrPoison", e.Type, payload, err)
			}
			// In a batch, the bad event fails the whole batch.
			err = inTx(ctx, h, func(tx TTx) error {
				return orders.ProjectionBatch(h.Store)(ctx, tx, []event.Envelope{created, bad})
			})
			if !errors.Is(err, idemkafka.ErrPoison) {
				t.Errorf("batch with %s %s: %v, want ErrPoison", e.Type, payload, err)
			}
		}
	}
	// A type the projection counts, in a version it does not know (a newer
	// producer's, in a rolling deploy), is poison: dead-lettered to be
	// redriven after the upgrade, never counted as a no-op the inbox
	// would remember.
	for _, e := range []event.Envelope{created, confirmed} {
		newer := e
		newer.Type = strings.TrimSuffix(e.Type, ".v1") + ".v2"
		err := inTx(ctx, h, func(tx TTx) error { return project(ctx, tx, newer) })
		if !errors.Is(err, idemkafka.ErrPoison) {
			t.Errorf("%s: %v, want ErrPoison", newer.Type, err)
		}
	}
	if s := summary(t, h, 77); s.Orders != 1 || s.Confirmed != 1 || s.TotalAmount.StringFixed(4) != "2.5000" {
		t.Errorf("after the bad events: summary %+v", s)
	}
}

// The events of an order may arrive in any order, alone or in batches (a
// republished old event, a batch replayed one at a time): the summaries
// come out the same.
func testProjectionCommutes[TTx any](t *testing.T, h Harness[TTx]) {
	// Customer c gets: order A confirmed (10.5), order B rejected (20),
	// order C confirmed (0.0001), order D only created.
	var all [][]event.Envelope // per customer, its 7 events
	for c := int64(100); c < 106; c++ {
		a, b := create(t, h, c, "10.5"), create(t, h, c, "20")
		cc, d := create(t, h, c, "0.0001"), create(t, h, c, "3")
		ac, ao := orderEvents(t, a, orders.EventOrderConfirmed)
		bc, bo := orderEvents(t, b, orders.EventOrderRejected)
		ccc, cco := orderEvents(t, cc, orders.EventOrderConfirmed)
		dc, _ := orderEvents(t, d, orders.EventOrderConfirmed)
		all = append(all, []event.Envelope{ac, ao, bc, bo, ccc, cco, dc})
	}
	orderings := []func(evs []event.Envelope){
		// 100: in order, one at a time.
		func(evs []event.Envelope) {
			for _, e := range evs {
				project(t, h, e)
			}
		},
		// 101: reversed, one at a time: every outcome before its creation.
		func(evs []event.Envelope) {
			for _, e := range slices.Backward(evs) {
				project(t, h, e)
			}
		},
		// 102: one batch.
		func(evs []event.Envelope) { project(t, h, evs...) },
		// 103: one batch, reversed.
		func(evs []event.Envelope) {
			rev := slices.Clone(evs)
			slices.Reverse(rev)
			project(t, h, rev...)
		},
		// 104: outcomes first, then the creations in a batch.
		func(evs []event.Envelope) {
			project(t, h, evs[1], evs[3], evs[5])
			project(t, h, evs[0], evs[2], evs[4], evs[6])
		},
		// 105: an outcome and a creation of other orders in each batch.
		func(evs []event.Envelope) {
			project(t, h, evs[5], evs[0])
			project(t, h, evs[1:5]...)
			project(t, h, evs[6])
		},
	}
	for i, apply := range orderings {
		apply(all[i])
	}
	for i, evs := range all {
		c := int64(100 + i)
		var lastID int64
		for _, e := range evs {
			var p struct {
				OrderID int64 `json:"order_id"`
			}
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				t.Fatal(err)
			}
			lastID = max(lastID, p.OrderID)
		}
		want := fmt.Sprintf("customer %d: orders 4 pending 1 confirmed 2 rejected 1 total 10.5001 last %d", c, lastID)
		if got := summaryString(summary(t, h, c)); got != want {
			t.Errorf("ordering %d:\ngot  %s\nwant %s", i, got, want)
		}
	}
	// Before its creation, an outcome alone makes a row with zero orders
	// and nothing pending.
	o := create(t, h, 200, "5")
	_, confirmed := orderEvents(t, o, orders.EventOrderConfirmed)
	project(t, h, confirmed)
	if got, want := summaryString(summary(t, h, 200)), fmt.Sprintf("customer 200: orders 0 pending 0 confirmed 1 rejected 0 total 5.0000 last %d", o.ID); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// Upserts from concurrent transactions (several consumers) all count.
func testConcurrentApplies[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			for {
				err := apply(ctx, h, int64(i+1), 9, "1.0100")
				if err == nil || !retryable(err) {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if s := summary(t, h, 9); s.Orders != n || s.Confirmed != n || s.TotalAmount.StringFixed(4) != "20.2000" || s.LastOrderID != n {
		t.Errorf("summary %+v (total %s)", s, s.TotalAmount)
	}
}

// The saga's updates: idempotent, in the caller's transaction, ErrNotFound
// for an unknown order.
func testSetStatusAndPayment[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	o := create(t, h, 3, "1")
	boom := errors.New("boom")
	if err := inTx(ctx, h, func(tx TTx) error {
		if err := h.Store.SetStatus(ctx, tx, o.ID, orders.StatusRejected); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("rolled back SetStatus: %v", err)
	}
	for range 2 { // again: a no-op
		if err := inTx(ctx, h, func(tx TTx) error {
			if err := h.Store.SetPayment(ctx, tx, o.ID, 77); err != nil {
				return err
			}
			return h.Store.SetStatus(ctx, tx, o.ID, orders.StatusConfirmed)
		}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := h.Store.Get(ctx, o.ID)
	if err != nil || got.Status != orders.StatusConfirmed || got.PaymentID != 77 || got.Amount.StringFixed(4) != "1.0000" {
		t.Errorf("Get = %+v, %v", got, err)
	}
	// GetTx reads through the transaction: its own uncommitted status too.
	if err := inTx(ctx, h, func(tx TTx) error {
		if err := h.Store.SetStatus(ctx, tx, o.ID, orders.StatusRejected); err != nil {
			return err
		}
		in, err := h.Store.GetTx(ctx, tx, o.ID)
		if err != nil || in.Status != orders.StatusRejected || in.PaymentID != 77 || in.CustomerID != 3 {
			t.Errorf("GetTx = %+v, %v", in, err)
		}
		if _, err := h.Store.GetTx(ctx, tx, 1<<62); !errors.Is(err, orders.ErrNotFound) {
			t.Errorf("GetTx of a missing order: %v", err)
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if o.PaymentID != 0 {
		t.Errorf("new order has payment %d", o.PaymentID)
	}
	err = inTx(ctx, h, func(tx TTx) error { return h.Store.SetStatus(ctx, tx, 1<<62, orders.StatusConfirmed) })
	if !errors.Is(err, orders.ErrNotFound) {
		t.Errorf("SetStatus of a missing order: %v", err)
	}
	err = inTx(ctx, h, func(tx TTx) error { return h.Store.SetPayment(ctx, tx, 1<<62, 1) })
	if !errors.Is(err, orders.ErrNotFound) {
		t.Errorf("SetPayment of a missing order: %v", err)
	}
}

// retryable reports a busy SQLite database; PostgreSQL's upsert needs no
// retry.
func retryable(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "SQLITE_BUSY") || strings.Contains(err.Error(), "database is locked"))
}

// testListCreatedBefore checks the watchdog's listing (orders.StaleLister,
// which every store implements): only CREATED orders created strictly
// before the time, after the ID, in ID order, a page at a time, with the
// creation time Get returns.
func testListCreatedBefore[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	list, ok := h.Store.(orders.StaleLister)
	if !ok {
		t.Fatalf("%T does not implement orders.StaleLister", h.Store)
	}
	var all []orders.Order
	for i := range 5 {
		all = append(all, create(t, h, int64(i+1), "1"))
		time.Sleep(2 * time.Millisecond) // distinct creation times
	}
	for i, status := range map[int]string{1: orders.StatusConfirmed, 3: orders.StatusRejected} {
		if err := inTx(ctx, h, func(tx TTx) error { return h.Store.SetStatus(ctx, tx, all[i].ID, status) }); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(st []orders.Stale) []int64 {
		out := make([]int64, len(st))
		for i, s := range st {
			out[i] = s.ID
		}
		return out
	}
	get := func(before time.Time, after int64, limit int) []orders.Stale {
		t.Helper()
		st, err := list.ListCreatedBefore(ctx, before, after, limit)
		if err != nil {
			t.Fatalf("ListCreatedBefore(%s, %d, %d): %v", before, after, limit, err)
		}
		return st
	}
	future := time.Now().Add(time.Hour)
	st := get(future, 0, 100)
	if want := []int64{all[0].ID, all[2].ID, all[4].ID}; !slices.Equal(ids(st), want) {
		t.Fatalf("all CREATED orders: %v, want %v", ids(st), want)
	}
	for i, s := range st {
		o := all[2*i]
		if !s.CreatedAt.Equal(o.CreatedAt) {
			t.Errorf("order %d: CreatedAt %s, want %s (as Create returned it)", s.ID, s.CreatedAt, o.CreatedAt)
		}
	}
	// Strictly before: the order created at that very time is not listed.
	if got, want := ids(get(all[2].CreatedAt, 0, 100)), []int64{all[0].ID}; !slices.Equal(got, want) {
		t.Errorf("before order %d's creation: %v, want %v", all[2].ID, got, want)
	}
	// In another time zone, the same instant.
	if got, want := ids(get(all[2].CreatedAt.In(time.FixedZone("UTC+3", 3*3600)), 0, 100)), []int64{all[0].ID}; !slices.Equal(got, want) {
		t.Errorf("before order %d's creation, UTC+3: %v, want %v", all[2].ID, got, want)
	}
	if got := get(all[0].CreatedAt, 0, 100); len(got) != 0 {
		t.Errorf("before the first order: %v, want none", ids(got))
	}
	// Pages of one.
	var paged []int64
	for after := int64(0); ; {
		page := get(future, after, 1)
		if len(page) == 0 {
			break
		}
		if len(page) > 1 {
			t.Fatalf("page of %d, limit 1", len(page))
		}
		paged = append(paged, page[0].ID)
		after = page[0].ID
	}
	if want := []int64{all[0].ID, all[2].ID, all[4].ID}; !slices.Equal(paged, want) {
		t.Errorf("paged: %v, want %v", paged, want)
	}
}

// The database refuses an order whose stored amount is not positive,
// whatever the caller skipped validating: zero, negative, or rounded to
// zero at the stored scale. The smallest positive amount is kept.
func testNonPositiveAmount[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	insert := func(amount string) (o orders.Order, err error) {
		err = inTx(ctx, h, func(tx TTx) (err error) {
			o, err = h.Store.Create(ctx, tx, orders.NewOrder{
				CustomerID: 1,
				Amount:     decimal.RequireFromString(amount),
				Items:      []orders.Item{{SKU: "A-1", Quantity: 1}},
			})
			return err
		})
		return o, err
	}
	for _, amount := range []string{"0", "0.00", "-1", "-0.0001", "0.00004"} {
		if o, err := insert(amount); err == nil {
			t.Errorf("amount %s: order %d stored with %s, want an error", amount, o.ID, o.Amount.StringFixed(4))
		}
	}
	for _, amount := range []string{"0.0001", "0.001", "0.00005"} {
		if _, err := insert(amount); err != nil {
			t.Errorf("amount %s: %v", amount, err)
		}
	}
}
