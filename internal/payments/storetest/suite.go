package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/payments"
)

// Harness is one store on a fresh, migrated database.
type Harness[TTx any] struct {
	Store payments.Store[TTx]
	// Driver begins and ends the transactions CreateOrGet runs in.
	Driver driver.Driver[TTx]
	// Count returns the number of rows of the payment table.
	Count func(ctx context.Context) (int, error)
}

// Run runs the suite; open returns a harness on a fresh database each time.
func Run[TTx any](t *testing.T, open func(t *testing.T) Harness[TTx]) {
	t.Helper()
	tests := map[string]func(*testing.T, Harness[TTx]){
		"CreateThenGet":          testCreateThenGet[TTx],
		"ExistingReturned":       testExistingReturned[TTx],
		"ExactAmounts":           testExactAmounts[TTx],
		"NotFound":               testNotFound[TTx],
		"RollbackLeavesNothing":  testRollbackLeavesNothing[TTx],
		"DuplicateKeepsTxUsable": testDuplicateKeepsTxUsable[TTx],
		"Concurrent":             testConcurrent[TTx],
		"GivenStatus":            testGivenStatus[TTx],
		"NonPositiveAmount":      testNonPositiveAmount[TTx],
	}
	for name, test := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, open(t))
		})
	}
}

func newPayment(ext, amount string) payments.NewPayment {
	return payments.NewPayment{Provider: "sber", ExternalID: ext, Amount: decimal.RequireFromString(amount), CustomerID: 42}
}

// createOrGet runs CreateOrGet in its own committed transaction.
func createOrGet[TTx any](ctx context.Context, h Harness[TTx], p payments.NewPayment) (payments.Payment, bool, error) {
	tx, err := h.Driver.Begin(ctx)
	if err != nil {
		return payments.Payment{}, false, err
	}
	pay, created, err := h.Store.CreateOrGet(ctx, tx, p)
	if err != nil {
		_ = h.Driver.Rollback(ctx, tx)
		return payments.Payment{}, false, err
	}
	return pay, created, h.Driver.Commit(ctx, tx)
}

func count[TTx any](t *testing.T, h Harness[TTx]) int {
	t.Helper()
	n, err := h.Count(context.Background())
	if err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}

func testCreateThenGet[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	p, created, err := createOrGet(ctx, h, newPayment("ext-1", "100.50"))
	if err != nil || !created {
		t.Fatalf("CreateOrGet: created %v, err %v", created, err)
	}
	if p.ID <= 0 || p.Provider != "sber" || p.ExternalID != "ext-1" || p.Status != payments.StatusPending || p.CustomerID != 42 {
		t.Errorf("created %+v", p)
	}
	if got := p.Amount.StringFixed(4); got != "100.5000" {
		t.Errorf("amount %s, want 100.5000", got)
	}
	if p.CreatedAt.Before(before) || p.CreatedAt.After(time.Now().Add(time.Second)) || p.CreatedAt.Location() != time.UTC {
		t.Errorf("created_at %v, want about now, UTC", p.CreatedAt)
	}
	got, err := h.Store.Get(ctx, p.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if fmt.Sprint(got) != fmt.Sprint(p) || !got.CreatedAt.Equal(p.CreatedAt) {
		t.Errorf("Get = %+v, want %+v", got, p)
	}
}

func testExistingReturned[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	first, _, err := createOrGet(ctx, h, newPayment("ext-1", "10"))
	if err != nil {
		t.Fatal(err)
	}
	// Same provider and external id, other details: the stored payment wins.
	again := newPayment("ext-1", "99")
	again.CustomerID = 7
	p, created, err := createOrGet(ctx, h, again)
	if err != nil || created {
		t.Fatalf("second CreateOrGet: created %v, err %v; want the existing payment", created, err)
	}
	if p.ID != first.ID || !p.Amount.Equal(first.Amount) || p.CustomerID != 42 {
		t.Errorf("got %+v, want the first payment %+v", p, first)
	}
	other := newPayment("ext-1", "10")
	other.Provider = "tinkoff"
	if p, created, err := createOrGet(ctx, h, other); err != nil || !created || p.ID == first.ID {
		t.Errorf("other provider: %+v, created %v, err %v; want a new payment", p, created, err)
	}
	if n := count(t, h); n != 2 {
		t.Errorf("%d rows, want 2", n)
	}
}

func testExactAmounts[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	for i, amount := range []string{"0.0001", "0.1", "999999999999999.9999", "123456789012345", "0.3"} {
		p, _, err := createOrGet(ctx, h, newPayment(fmt.Sprint("ext-", i), amount))
		if err != nil {
			t.Fatalf("%s: %v", amount, err)
		}
		got, err := h.Store.Get(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := decimal.RequireFromString(amount).StringFixed(4)
		if got.Amount.StringFixed(4) != want || got.Amount.String() != decimal.RequireFromString(amount).String() {
			t.Errorf("stored %s, read back %s (%s)", amount, got.Amount.StringFixed(4), got.Amount)
		}
	}
}

func testNotFound[TTx any](t *testing.T, h Harness[TTx]) {
	if _, err := h.Store.Get(context.Background(), 12345); !errors.Is(err, payments.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
	}
}

func testRollbackLeavesNothing[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	tx, err := h.Driver.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := h.Store.CreateOrGet(ctx, tx, newPayment("ext-1", "1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Driver.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store.Get(ctx, p.ID); !errors.Is(err, payments.ErrNotFound) {
		t.Errorf("rolled back payment found: %v", err)
	}
	if _, created, err := createOrGet(ctx, h, newPayment("ext-1", "1")); err != nil || !created {
		t.Errorf("after rollback: created %v, err %v; want created", created, err)
	}
}

func testDuplicateKeepsTxUsable[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	if _, _, err := createOrGet(ctx, h, newPayment("ext-1", "1")); err != nil {
		t.Fatal(err)
	}
	tx, err := h.Driver.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Driver.Rollback(ctx, tx) }()
	if _, created, err := h.Store.CreateOrGet(ctx, tx, newPayment("ext-1", "1")); err != nil || created {
		t.Fatalf("duplicate: created %v, err %v", created, err)
	}
	if _, created, err := h.Store.CreateOrGet(ctx, tx, newPayment("ext-2", "1")); err != nil || !created {
		t.Fatalf("after the duplicate, in the same transaction: created %v, err %v", created, err)
	}
	if err := h.Driver.Commit(ctx, tx); err != nil {
		t.Fatalf("commit after a duplicate: %v", err)
	}
	if n := count(t, h); n != 2 {
		t.Errorf("%d rows, want 2", n)
	}
}

func testConcurrent[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	const n = 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ids     = map[int64]int{}
		created int
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			p, isNew, err := createOrGet(ctx, h, newPayment("ext-concurrent", "5"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("CreateOrGet: %v", err)
				return
			}
			ids[p.ID]++
			if isNew {
				created++
			}
		})
	}
	close(start)
	wg.Wait()
	if len(ids) != 1 || created != 1 {
		t.Errorf("ids %v, %d creators; want one id, one creator", ids, created)
	}
	if got := count(t, h); got != 1 {
		t.Errorf("%d rows, want exactly 1", got)
	}
}

// A payment created with a status keeps it (the order saga's are
// CAPTURED); without one it is PENDING.
func testGivenStatus[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	captured := newPayment("ext-captured", "7.25")
	captured.Status = payments.StatusCaptured
	p, created, err := createOrGet(ctx, h, captured)
	if err != nil || !created || p.Status != payments.StatusCaptured {
		t.Fatalf("CreateOrGet: %+v, created %v, err %v; want a new CAPTURED payment", p, created, err)
	}
	if got, err := h.Store.Get(ctx, p.ID); err != nil || got.Status != payments.StatusCaptured {
		t.Errorf("Get = %+v, %v; want CAPTURED", got, err)
	}
	// The existing payment is returned as stored, whatever status is asked.
	again := newPayment("ext-captured", "7.25")
	if p2, created, err := createOrGet(ctx, h, again); err != nil || created || p2.ID != p.ID || p2.Status != payments.StatusCaptured {
		t.Errorf("again: %+v, created %v, err %v; want the CAPTURED payment", p2, created, err)
	}
	if p3, _, err := createOrGet(ctx, h, newPayment("ext-default", "1")); err != nil || p3.Status != payments.StatusPending {
		t.Errorf("no status: %+v, %v; want PENDING", p3, err)
	}
}

// The database refuses a payment whose stored amount is not positive,
// whatever the caller skipped validating: zero, negative, or rounded to
// zero at the stored scale. The smallest positive amount is kept.
func testNonPositiveAmount[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	for i, amount := range []string{"0", "0.00", "-1", "-0.0001", "0.00004"} {
		if p, _, err := createOrGet(ctx, h, newPayment(fmt.Sprint("ext-bad-", i), amount)); err == nil {
			t.Errorf("amount %s: stored as %s, want an error", amount, p.Amount.StringFixed(4))
		}
	}
	if n := count(t, h); n != 0 {
		t.Errorf("%d rows after the refused amounts, want 0", n)
	}
	for i, amount := range []string{"0.0001", "0.001", "0.00005"} {
		if _, _, err := createOrGet(ctx, h, newPayment(fmt.Sprint("ext-good-", i), amount)); err != nil {
			t.Errorf("amount %s: %v", amount, err)
		}
	}
}
