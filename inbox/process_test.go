package inbox_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/driver"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/inbox"
)

const (
	consumer  = "order-projection"
	consumer2 = "notifier"
)

var errBoom = errors.New("handler failed")

func mustProcess[TTx any](t *testing.T, ib *inbox.Inbox[TTx], id uuid.UUID, fn func(context.Context, TTx) error, want bool) {
	t.Helper()
	applied, err := ib.Process(t.Context(), id, fn)
	if err != nil {
		t.Fatalf("Process(%s): %v", id, err)
	}
	if applied != want {
		t.Fatalf("Process(%s) applied = %v; want %v", id, applied, want)
	}
}

// The same event delivered ten times takes effect once; the handler runs
// once.
func testRedeliveredOnce[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	id := newID(t)
	calls := 0
	fn := func(ctx context.Context, tx TTx) error {
		calls++
		return f.effect(ctx, tx, consumer, id)
	}
	mustProcess(t, ib, id, fn, true)
	for range 9 {
		mustProcess(t, ib, id, fn, false)
	}
	if calls != 1 {
		t.Errorf("handler ran %d times for 10 deliveries; want 1", calls)
	}
	f.mustEffects(t, consumer, id, 1)
	f.mustProcessed(t, consumer, id, 1)

	// Another event is not affected.
	other := newID(t)
	mustProcess(t, ib, other, f.apply(consumer, other), true)
	f.mustEffects(t, consumer, other, 1)
}

// A failing handler leaves neither its effect nor the dedup row: the
// redelivery applies the event, once.
func testHandlerError[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	id := newID(t)
	applied, err := ib.Process(t.Context(), id, func(ctx context.Context, tx TTx) error {
		if err := f.effect(ctx, tx, consumer, id); err != nil {
			return err
		}
		return errBoom
	})
	if applied || !errors.Is(err, errBoom) {
		t.Fatalf("Process with a failing handler = %v, %v; want false and the handler's error", applied, err)
	}
	var ee *inbox.EventError
	if !errors.As(err, &ee) || ee.ID != id || ee.Index != 0 {
		t.Errorf("error %v: want an *EventError for %s at index 0", err, id)
	}
	f.mustEffects(t, consumer, id, 0)
	f.mustProcessed(t, consumer, id, 0)

	mustProcess(t, ib, id, f.apply(consumer, id), true)
	mustProcess(t, ib, id, f.apply(consumer, id), false)
	f.mustEffects(t, consumer, id, 1)
	f.mustProcessed(t, consumer, id, 1)
}

// A panicking handler: the panic goes on, the transaction rolls back.
func testHandlerPanic[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	id := newID(t)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v; want the handler's panic", p)
			}
		}()
		_, _ = ib.Process(t.Context(), id, func(ctx context.Context, tx TTx) error {
			if err := f.effect(ctx, tx, consumer, id); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	f.mustEffects(t, consumer, id, 0)
	f.mustProcessed(t, consumer, id, 0)
	mustProcess(t, ib, id, f.apply(consumer, id), true)
	f.mustEffects(t, consumer, id, 1)
}

type outcome struct {
	applied bool
	err     error
	at      time.Time
}

// processAll delivers id n times at once.
func processAll[TTx any](t *testing.T, ib *inbox.Inbox[TTx], n int, id uuid.UUID, fn func(context.Context, TTx) error) []outcome {
	t.Helper()
	out := make([]outcome, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			applied, err := ib.Process(t.Context(), id, fn)
			out[i] = outcome{applied, err, time.Now()}
		})
	}
	close(start)
	wg.Wait()
	return out
}

// 20 deliveries of one event at once: exactly one effect. The duplicates do
// not decide before the first transaction ended: on PostgreSQL they wait on
// the primary key of processed_event, on SQLite for the write lock.
func testConcurrentDuplicates[TTx any](t *testing.T, f *fixture[TTx]) {
	const n = 20
	ib := f.inbox(t, consumer)
	id := newID(t)
	var (
		calls   atomic.Int32
		doneMu  sync.Mutex
		fnEnded time.Time
	)
	out := processAll(t, ib, n, id, func(ctx context.Context, tx TTx) error {
		calls.Add(1)
		if err := f.effect(ctx, tx, consumer, id); err != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond) // hold the transaction open
		doneMu.Lock()
		fnEnded = time.Now()
		doneMu.Unlock()
		return nil
	})
	applied := 0
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("delivery %d: %v", i, o.err)
		}
		if o.applied {
			applied++
		} else if o.at.Before(fnEnded) {
			t.Errorf("delivery %d returned duplicate before the applying transaction finished its handler", i)
		}
	}
	if applied != 1 || calls.Load() != 1 {
		t.Fatalf("%d concurrent deliveries: %d applied, handler ran %d times; want 1 and 1", n, applied, calls.Load())
	}
	f.mustEffects(t, consumer, id, 1)
	f.mustProcessed(t, consumer, id, 1)
}

// The first of the concurrent deliveries fails: its dedup row rolls back
// with it, and exactly one of the waiting deliveries applies the event.
func testConcurrentFirstFails[TTx any](t *testing.T, f *fixture[TTx]) {
	const n = 20
	ib := f.inbox(t, consumer)
	id := newID(t)
	var calls atomic.Int32
	out := processAll(t, ib, n, id, func(ctx context.Context, tx TTx) error {
		if err := f.effect(ctx, tx, consumer, id); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			time.Sleep(50 * time.Millisecond) // let the others queue up
			return errBoom
		}
		return nil
	})
	var applied, failed int
	for i, o := range out {
		switch {
		case errors.Is(o.err, errBoom):
			failed++
		case o.err != nil:
			t.Fatalf("delivery %d: %v", i, o.err)
		case o.applied:
			applied++
		}
	}
	if failed != 1 || applied != 1 || calls.Load() != 2 {
		t.Fatalf("%d concurrent deliveries, the first failing: %d failed, %d applied, handler ran %d times; want 1, 1, 2",
			n, failed, applied, calls.Load())
	}
	f.mustEffects(t, consumer, id, 1)
	f.mustProcessed(t, consumer, id, 1)
}

// Two consumers of one event: one effect each, however often it comes.
func testConsumers[TTx any](t *testing.T, f *fixture[TTx]) {
	a, b := f.inbox(t, consumer), f.inbox(t, consumer2)
	if a.Consumer() != consumer {
		t.Errorf("Consumer() = %q", a.Consumer())
	}
	id := newID(t)
	for round := range 3 {
		mustProcess(t, a, id, f.apply(consumer, id), round == 0)
		mustProcess(t, b, id, f.apply(consumer2, id), round == 0)
	}
	f.mustEffects(t, consumer, id, 1)
	f.mustEffects(t, consumer2, id, 1)
	f.mustProcessed(t, consumer, id, 1)
	f.mustProcessed(t, consumer2, id, 1)
}

// The nil UUID is refused before any transaction: deduplicating on it would
// drop every event whose ID was never set.
func testNilEventID[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	called := false
	applied, err := ib.Process(t.Context(), uuid.Nil, func(context.Context, TTx) error { called = true; return nil })
	if applied || called || !errors.Is(err, inbox.ErrNilEventID) {
		t.Fatalf("Process(uuid.Nil) = %v, %v (handler called: %v); want ErrNilEventID", applied, err, called)
	}
	f.mustProcessed(t, consumer, uuid.Nil, 0)
}

// ProcessTx joins the caller's transaction and never commits: the caller's
// own write, the effect and the dedup row commit or roll back together.
func testProcessTx[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	ib := f.inbox(t, consumer)
	id := newID(t)
	own := newID(t) // the caller's own write, as an effect of another "consumer"

	// Rolled back: nothing, the event is still new.
	tx := begin(t, f)
	if err := f.effect(ctx, tx, "caller", own); err != nil {
		t.Fatalf("caller's write: %v", err)
	}
	applied, err := ib.ProcessTx(ctx, tx, id, f.apply(consumer, id))
	if err != nil || !applied {
		t.Fatalf("ProcessTx = %v, %v; want applied", applied, err)
	}
	// Inside the transaction the event is already processed.
	applied, err = ib.ProcessTx(ctx, tx, id, f.apply(consumer, id))
	if err != nil || applied {
		t.Fatalf("second ProcessTx in the same transaction = %v, %v; want a duplicate", applied, err)
	}
	if err := f.drv.Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	f.mustEffects(t, "caller", own, 0)
	f.mustEffects(t, consumer, id, 0)
	f.mustProcessed(t, consumer, id, 0)

	// Committed by the caller: everything.
	tx = begin(t, f)
	if err := f.effect(ctx, tx, "caller", own); err != nil {
		t.Fatalf("caller's write: %v", err)
	}
	if applied, err := ib.ProcessTx(ctx, tx, id, f.apply(consumer, id)); err != nil || !applied {
		t.Fatalf("ProcessTx = %v, %v; want applied", applied, err)
	}
	commit(t, f, tx)
	f.mustEffects(t, "caller", own, 1)
	f.mustEffects(t, consumer, id, 1)
	f.mustProcessed(t, consumer, id, 1)

	// A duplicate calls nothing and leaves the caller's transaction usable.
	tx = begin(t, f)
	called := false
	applied, err = ib.ProcessTx(ctx, tx, id, func(context.Context, TTx) error { called = true; return nil })
	if err != nil || applied || called {
		t.Fatalf("ProcessTx of a processed event = %v, %v (handler called: %v); want a duplicate", applied, err, called)
	}
	if err := f.effect(ctx, tx, "caller", own); err != nil {
		t.Fatalf("caller's write after a duplicate: %v", err)
	}
	commit(t, f, tx)
	f.mustEffects(t, "caller", own, 2)
	f.mustEffects(t, consumer, id, 1)

	// A failing handler: the error comes back, the caller rolls back.
	other := newID(t)
	tx = begin(t, f)
	if _, err := ib.ProcessTx(ctx, tx, other, func(context.Context, TTx) error { return errBoom }); !errors.Is(err, errBoom) {
		t.Fatalf("ProcessTx with a failing handler: %v; want the handler's error", err)
	}
	if err := f.drv.Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	mustProcess(t, ib, other, f.apply(consumer, other), true)
}

// begin starts a transaction rolled back at the end of the test unless the
// test ended it.
func begin[TTx any](t *testing.T, f *fixture[TTx]) TTx {
	t.Helper()
	tx, err := f.drv.Begin(t.Context())
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	t.Cleanup(func() { _ = f.drv.Rollback(context.Background(), tx) })
	return tx
}

func commit[TTx any](t *testing.T, f *fixture[TTx], tx TTx) {
	t.Helper()
	if err := f.drv.Commit(t.Context(), tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

// OnResult sees every call with its counts and error.
func testOnResult[TTx any](t *testing.T, f *fixture[TTx]) {
	var (
		mu      sync.Mutex
		results []inbox.Result
	)
	ib, err := inbox.New(f.drv, &inbox.Config{
		Consumer: consumer,
		OnResult: func(_ context.Context, r inbox.Result) {
			mu.Lock()
			defer mu.Unlock()
			results = append(results, r)
		},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx := t.Context()
	a, b := newID(t), newID(t)
	_, _ = ib.Process(ctx, a, f.apply(consumer, a))
	_, _ = ib.Process(ctx, a, f.apply(consumer, a))
	_, _ = ib.Process(ctx, b, func(context.Context, TTx) error { return errBoom })
	_, _ = ib.ProcessBatch(ctx, []inbox.Event{{ID: a}, {ID: b}, {ID: b}}, func(ctx context.Context, tx TTx, e inbox.Event) error {
		return f.effect(ctx, tx, consumer, e.ID)
	})
	want := []inbox.Result{
		{Consumer: consumer, Events: 1, Applied: 1},
		{Consumer: consumer, Events: 1, Duplicates: 1},
		{Consumer: consumer, Events: 1, Err: errBoom},
		{Consumer: consumer, Events: 3, Applied: 1, Duplicates: 2},
	}
	if len(results) != len(want) {
		t.Fatalf("OnResult called %d times: %+v; want %d", len(results), results, len(want))
	}
	for i, r := range results {
		w := want[i]
		if r.Consumer != w.Consumer || r.Events != w.Events || r.Applied != w.Applied || r.Duplicates != w.Duplicates ||
			!errors.Is(r.Err, w.Err) || (w.Err == nil) != (r.Err == nil) || r.Duration <= 0 {
			t.Errorf("result %d = %+v; want %+v with a positive Duration", i, r, w)
		}
	}
}

// processed_at comes from Config.Now.
func testProcessedAt[TTx any](t *testing.T, f *fixture[TTx]) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 678_901_000, time.UTC)
	ib, err := inbox.New(f.drv, &inbox.Config{Consumer: consumer, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	id := newID(t)
	mustProcess(t, ib, id, f.apply(consumer, id), true)
	oldest, ok, err := f.drv.Executor().InboxOldest(t.Context())
	if err != nil || !ok || !oldest.Equal(now) {
		t.Errorf("InboxOldest = %s, %v, %v; want %s", oldest, ok, err, now)
	}
}

// Once the cleanup deleted an event's row, a redelivery applies it again:
// retention must cover the redelivery window (see the package doc).
func testCleanedUp[TTx any](t *testing.T, f *fixture[TTx]) {
	now := time.Now()
	ib, err := inbox.New(f.drv, &inbox.Config{Consumer: consumer, Now: func() time.Time { return now.Add(-73 * time.Hour) }})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	old, recent := newID(t), newID(t)
	mustProcess(t, ib, old, f.apply(consumer, old), true)
	fresh := f.inbox(t, consumer)
	mustProcess(t, fresh, recent, f.apply(consumer, recent), true)

	res, err := f.drv.Executor().InboxDeleteBefore(t.Context(), &driver.InboxDeleteBeforeParams{Consumer: consumer, Before: now.Add(-72 * time.Hour), Limit: 100})
	if err != nil || res.Deleted != 1 {
		t.Fatalf("InboxDeleteBefore = %d, %v; want 1", res.Deleted, err)
	}
	mustProcess(t, fresh, recent, f.apply(consumer, recent), false)
	mustProcess(t, fresh, old, f.apply(consumer, old), true)
	f.mustEffects(t, consumer, old, 2)
}
