package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
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
		"ConcurrentApplies":     testConcurrentApplies[TTx],
		"SetStatusAndPayment":   testSetStatusAndPayment[TTx],
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

func apply[TTx any](ctx context.Context, h Harness[TTx], order, customer int64, amount string) error {
	return inTx(ctx, h, func(tx TTx) error {
		return h.Store.ApplyCreated(ctx, tx, orders.OrderCreated{OrderID: order, CustomerID: customer, Amount: amount})
	})
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
		if err := h.Store.ApplyCreated(ctx, tx, orders.OrderCreated{OrderID: o.ID, CustomerID: 1, Amount: "1.0000"}); err != nil {
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
	s := summary(t, h, 5)
	if s.CustomerID != 5 || s.Orders != 4 || s.TotalAmount.StringFixed(4) != "1000000000000000.3000" || s.LastOrderID != 10 || s.UpdatedAt.IsZero() {
		t.Errorf("summary %+v (total %s)", s, s.TotalAmount)
	}
	if s := summary(t, h, 6); s.Orders != 1 || s.TotalAmount.StringFixed(4) != "19.9000" || s.LastOrderID != 3 {
		t.Errorf("summary %+v", s)
	}
}

func testProjectionIgnores[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	project := orders.Projection(h.Store)
	o := create(t, h, 77, "2.5")
	created, err := orders.CreatedEvent(o)
	if err != nil {
		t.Fatal(err)
	}
	other, err := event.New("OrderShipped.v1", "1", map[string]int{"order_id": 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []event.Envelope{created, other} {
		if err := inTx(ctx, h, func(tx TTx) error { return project(ctx, tx, e) }); err != nil {
			t.Fatalf("project %s: %v", e.Type, err)
		}
	}
	if s := summary(t, h, 77); s.Orders != 1 || s.TotalAmount.StringFixed(4) != "2.5000" || s.LastOrderID != o.ID {
		t.Errorf("summary %+v", s)
	}
	bad := created
	bad.Payload = []byte(`{"order_id":"x"}`)
	if err := inTx(ctx, h, func(tx TTx) error { return project(ctx, tx, bad) }); err == nil {
		t.Error("bad payload applied")
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
	if s := summary(t, h, 9); s.Orders != n || s.TotalAmount.StringFixed(4) != "20.2000" || s.LastOrderID != n {
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
