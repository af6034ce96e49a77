package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idem/inbox"
)

func events(ids ...uuid.UUID) []inbox.Event {
	out := make([]inbox.Event, len(ids))
	for i, id := range ids {
		out[i] = inbox.Event{ID: id, Payload: fmt.Sprintf("payload %d", i)}
	}
	return out
}

// batchHandler writes each event's effect and records the order of calls.
func batchHandler[TTx any](f *fixture[TTx], seen *[]string) func(context.Context, TTx, inbox.Event) error {
	return func(ctx context.Context, tx TTx, e inbox.Event) error {
		*seen = append(*seen, e.Payload.(string))
		return f.effect(ctx, tx, consumer, e.ID)
	}
}

func mustBatch[TTx any](t *testing.T, ib *inbox.Inbox[TTx], evs []inbox.Event, fn func(context.Context, TTx, inbox.Event) error, want inbox.BatchResult) {
	t.Helper()
	res, err := ib.ProcessBatch(t.Context(), evs, fn)
	if err != nil {
		t.Fatalf("ProcessBatch: %v", err)
	}
	if res != want {
		t.Fatalf("ProcessBatch = %+v; want %+v", res, want)
	}
}

// Duplicates inside a batch and against earlier batches are skipped with
// exact counts; the handler sees the new events once each, in input order.
func testBatchDuplicates[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	a, b, c, d, e := newID(t), newID(t), newID(t), newID(t), newID(t)

	var seen []string
	mustBatch(t, ib, events(a, b, a, c, b), batchHandler(f, &seen), inbox.BatchResult{Applied: 3, Duplicates: 2})
	if want := []string{"payload 0", "payload 1", "payload 3"}; !slices.Equal(seen, want) {
		t.Errorf("handler saw %v; want %v (the first copy of each ID, in order)", seen, want)
	}

	seen = nil
	mustBatch(t, ib, events(c, e, d, a, e, d), batchHandler(f, &seen), inbox.BatchResult{Applied: 2, Duplicates: 4})
	if want := []string{"payload 1", "payload 2"}; !slices.Equal(seen, want) {
		t.Errorf("handler saw %v; want %v", seen, want)
	}

	seen = nil
	mustBatch(t, ib, events(e, d, c, b, a), batchHandler(f, &seen), inbox.BatchResult{Duplicates: 5})
	if len(seen) != 0 {
		t.Errorf("a batch of duplicates called the handler for %v", seen)
	}
	for _, id := range []uuid.UUID{a, b, c, d, e} {
		f.mustEffects(t, consumer, id, 1)
		f.mustProcessed(t, consumer, id, 1)
	}
	// Single deliveries agree with the batches.
	mustProcess(t, ib, c, f.apply(consumer, c), false)

	// A large batch: one statement, exact counts.
	big := make([]uuid.UUID, 1200)
	for i := range big {
		big[i] = newID(t)
	}
	mixed := slices.Concat(big[:600], []uuid.UUID{a, b}, big[:600], big[600:])
	seen = nil
	mustBatch(t, ib, events(mixed...), batchHandler(f, &seen), inbox.BatchResult{Applied: 1200, Duplicates: 602})
}

// The handler fails on the third event: nothing of the batch commits, the
// error names the event, and the batch applies in full once fixed; or the
// caller dead-letters the event and applies the rest.
func testBatchFailure[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	ids := []uuid.UUID{newID(t), newID(t), newID(t), newID(t)}
	calls := 0
	failOn := func(bad uuid.UUID) func(context.Context, TTx, inbox.Event) error {
		return func(ctx context.Context, tx TTx, e inbox.Event) error {
			calls++
			if err := f.effect(ctx, tx, consumer, e.ID); err != nil {
				return err
			}
			if e.ID == bad {
				return errBoom
			}
			return nil
		}
	}
	res, err := ib.ProcessBatch(t.Context(), events(ids...), failOn(ids[2]))
	var ee *inbox.EventError
	if !errors.As(err, &ee) || !errors.Is(err, errBoom) {
		t.Fatalf("ProcessBatch with the handler failing on event 3 = %+v, %v; want an *EventError wrapping the handler's error", res, err)
	}
	if ee.Index != 2 || ee.ID != ids[2] || res != (inbox.BatchResult{}) {
		t.Errorf("EventError{ID: %s, Index: %d}, result %+v; want ID %s, Index 2, zero result", ee.ID, ee.Index, res, ids[2])
	}
	if calls != 3 {
		t.Errorf("handler ran %d times; want 3 (it stops at the failing event)", calls)
	}
	for _, id := range ids {
		f.mustEffects(t, consumer, id, 0)
		f.mustProcessed(t, consumer, id, 0)
	}

	// Index counts positions in the input, duplicates included.
	mustProcess(t, ib, ids[0], f.apply(consumer, ids[0]), true)
	_, err = ib.ProcessBatch(t.Context(), events(ids[0], ids[1], ids[1], ids[3]), failOn(ids[3]))
	if !errors.As(err, &ee) || ee.Index != 3 || ee.ID != ids[3] {
		t.Fatalf("ProcessBatch failing on the last of [processed, new, dup, new] = %v; want an *EventError at index 3", err)
	}
	f.mustEffects(t, consumer, ids[1], 0)

	// Dead-letter the failing event (the batch's index 3), apply the others.
	failed := []uuid.UUID{ids[0], ids[1], ids[1], ids[3]}
	var rest []uuid.UUID
	for i, id := range failed {
		if i != ee.Index {
			rest = append(rest, id)
		}
	}
	mustBatch(t, ib, events(rest...), failOn(uuid.Nil), inbox.BatchResult{Applied: 1, Duplicates: 2})
	mustBatch(t, ib, events(ids[2]), failOn(uuid.Nil), inbox.BatchResult{Applied: 1})
	f.mustEffects(t, consumer, ids[0], 1)
	f.mustEffects(t, consumer, ids[1], 1)
	f.mustEffects(t, consumer, ids[2], 1)
	f.mustEffects(t, consumer, ids[3], 0)
	f.mustProcessed(t, consumer, ids[3], 0)
}

// An event with the nil ID fails the batch before anything runs, and is
// named like a failing event, so the caller can dead-letter it.
func testBatchNilID[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	a := newID(t)
	called := false
	_, err := ib.ProcessBatch(t.Context(), events(a, uuid.Nil), func(context.Context, TTx, inbox.Event) error {
		called = true
		return nil
	})
	var ee *inbox.EventError
	if !errors.Is(err, inbox.ErrNilEventID) || !errors.As(err, &ee) || ee.Index != 1 || called {
		t.Fatalf("ProcessBatch with a nil ID at index 1 = %v (handler called: %v); want an *EventError at index 1 wrapping ErrNilEventID", err, called)
	}
	f.mustProcessed(t, consumer, a, 0)
}

func testBatchEmpty[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	for _, evs := range [][]inbox.Event{nil, {}} {
		res, err := ib.ProcessBatch(t.Context(), evs, func(context.Context, TTx, inbox.Event) error {
			t.Error("handler called for an empty batch")
			return nil
		})
		if err != nil || res != (inbox.BatchResult{}) {
			t.Errorf("ProcessBatch(%v) = %+v, %v; want zero, nil", evs, res, err)
		}
	}
}

// ProcessBatchTx joins the caller's transaction: what the caller does with it
// decides for the whole batch.
func testProcessBatchTx[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	ib := f.inbox(t, consumer)
	a, b := newID(t), newID(t)
	var seen []string

	tx := begin(t, f)
	res, err := ib.ProcessBatchTx(ctx, tx, events(a, b, a), batchHandler(f, &seen))
	if err != nil || res != (inbox.BatchResult{Applied: 2, Duplicates: 1}) {
		t.Fatalf("ProcessBatchTx = %+v, %v", res, err)
	}
	if err := f.drv.Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	f.mustEffects(t, consumer, a, 0)
	f.mustProcessed(t, consumer, a, 0)

	tx = begin(t, f)
	res, err = ib.ProcessBatchTx(ctx, tx, events(b, a), batchHandler(f, &seen))
	if err != nil || res != (inbox.BatchResult{Applied: 2}) {
		t.Fatalf("ProcessBatchTx after the rollback = %+v, %v; want both applied", res, err)
	}
	commit(t, f, tx)
	f.mustEffects(t, consumer, a, 1)
	f.mustEffects(t, consumer, b, 1)
	mustBatch(t, ib, events(a, b), batchHandler(f, &seen), inbox.BatchResult{Duplicates: 2})
}

// Concurrent batches with overlapping IDs, in different orders: no error
// (no deadlock), every event takes effect exactly once.
func testBatchConcurrent[TTx any](t *testing.T, f *fixture[TTx]) {
	const (
		workers = 8
		size    = 100
	)
	ib := f.inbox(t, consumer)
	ids := make([]uuid.UUID, size)
	for i := range ids {
		ids[i] = newID(t)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied int
		errs    []error
	)
	start := make(chan struct{})
	for w := range workers {
		batch := slices.Clone(ids)
		if w%2 == 1 {
			slices.Reverse(batch)
		}
		batch = batch[w*5 : w*5+60]
		wg.Go(func() {
			<-start
			res, err := ib.ProcessBatch(t.Context(), events(batch...), func(ctx context.Context, tx TTx, e inbox.Event) error {
				return f.effect(ctx, tx, consumer, e.ID)
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			applied += res.Applied
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d concurrent batches failed, first: %v", len(errs), workers, errs[0])
	}
	total := 0
	for _, id := range ids {
		n := f.effects(t, consumer, id)
		if n > 1 {
			t.Errorf("event %s took effect %d times", id, n)
		}
		total += n
	}
	if total != applied {
		t.Errorf("%d effects committed, batches reported %d applied", total, applied)
	}
}
