package inbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
)

func TestBulkPostgres(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	runBulkScenarios(t, setupPostgres)
}

func TestBulkSQLite(t *testing.T) {
	t.Parallel()
	runBulkScenarios(t, setupSQLite)
}

func runBulkScenarios[TTx any](t *testing.T, setup func(t *testing.T) *fixture[TTx]) {
	for _, sc := range []scenario[TTx]{
		{"Duplicates", testBulkDuplicates[TTx]},
		{"FailureRollsBackAll", testBulkFailure[TTx]},
		{"PanicRollsBackAll", testBulkPanic[TTx]},
		{"NilEventID", testBulkNilID[TTx]},
		{"Tx", testProcessBulkTx[TTx]},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.fn(t, setup(t))
		})
	}
}

// bulkHandler writes the effect of every event it is given and records
// each call's payloads.
func bulkHandler[TTx any](f *fixture[TTx], calls *[][]string) func(context.Context, TTx, []inbox.Event) error {
	return func(ctx context.Context, tx TTx, fresh []inbox.Event) error {
		var seen []string
		for _, e := range fresh {
			seen = append(seen, e.Payload.(string))
			if err := f.effect(ctx, tx, consumer, e.ID); err != nil {
				return err
			}
		}
		*calls = append(*calls, seen)
		return nil
	}
}

func mustBulk[TTx any](t *testing.T, ib *inbox.Inbox[TTx], evs []inbox.Event, fn func(context.Context, TTx, []inbox.Event) error, want inbox.BatchResult) {
	t.Helper()
	res, err := ib.ProcessBulk(t.Context(), evs, fn)
	if err != nil {
		t.Fatalf("ProcessBulk: %v", err)
	}
	if res != want {
		t.Fatalf("ProcessBulk = %+v; want %+v", res, want)
	}
}

// The handler is called once per batch with the new events only (first
// copy of each ID, in input order); duplicates within the batch and of
// earlier batches (of any form) are skipped; a batch of duplicates does not
// call it; an empty batch does nothing.
func testBulkDuplicates[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	a, b, c, d, e := newID(t), newID(t), newID(t), newID(t), newID(t)

	var calls [][]string
	mustBulk(t, ib, events(a, b, a, c, b), bulkHandler(f, &calls), inbox.BatchResult{Applied: 3, Duplicates: 2})
	if want := [][]string{{"payload 0", "payload 1", "payload 3"}}; !slices.EqualFunc(calls, want, slices.Equal) {
		t.Errorf("handler calls %v; want %v (one call, the first copy of each ID, in order)", calls, want)
	}

	calls = nil
	mustBulk(t, ib, events(c, e, d, a, e, d), bulkHandler(f, &calls), inbox.BatchResult{Applied: 2, Duplicates: 4})
	if want := [][]string{{"payload 1", "payload 2"}}; !slices.EqualFunc(calls, want, slices.Equal) {
		t.Errorf("handler calls %v; want %v", calls, want)
	}

	calls = nil
	mustBulk(t, ib, events(e, d, c, b, a), bulkHandler(f, &calls), inbox.BatchResult{Duplicates: 5})
	if len(calls) != 0 {
		t.Errorf("a batch of duplicates called the handler: %v", calls)
	}
	for _, id := range []uuid.UUID{a, b, c, d, e} {
		f.mustEffects(t, consumer, id, 1)
		f.mustProcessed(t, consumer, id, 1)
	}
	// The other forms agree: the events are processed.
	mustProcess(t, ib, c, f.apply(consumer, c), false)
	var seen []string
	mustBatch(t, ib, events(a, newID(t)), batchHandler(f, &seen), inbox.BatchResult{Applied: 1, Duplicates: 1})

	for _, evs := range [][]inbox.Event{nil, {}} {
		res, err := ib.ProcessBulk(t.Context(), evs, func(context.Context, TTx, []inbox.Event) error {
			t.Error("handler called for an empty batch")
			return nil
		})
		if err != nil || res != (inbox.BatchResult{}) {
			t.Errorf("ProcessBulk(%v) = %+v, %v; want zero, nil", evs, res, err)
		}
	}
}

// The handler writes every effect, then fails: nothing of the batch commits,
// no dedup row either, and the error is a *BulkError wrapping the handler's.
// The batch then applies in full.
func testBulkFailure[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	old := newID(t)
	mustProcess(t, ib, old, f.apply(consumer, old), true)
	ids := []uuid.UUID{newID(t), old, newID(t), newID(t)}

	var calls [][]string
	failing := func(ctx context.Context, tx TTx, fresh []inbox.Event) error {
		if err := bulkHandler(f, &calls)(ctx, tx, fresh); err != nil {
			return err
		}
		return errBoom
	}
	res, err := ib.ProcessBulk(t.Context(), events(ids...), failing)
	var be *inbox.BulkError
	if !errors.As(err, &be) || !errors.Is(err, errBoom) || res != (inbox.BatchResult{}) {
		t.Fatalf("ProcessBulk with a failing handler = %+v, %v; want zero, a *BulkError wrapping the handler's error", res, err)
	}
	var ee *inbox.EventError
	if be.Events != 3 || errors.As(err, &ee) {
		t.Errorf("BulkError{Events: %d}, EventError %v; want 3 events (the new ones) and no EventError", be.Events, ee)
	}
	if len(calls) != 1 || len(calls[0]) != 3 {
		t.Errorf("handler calls %v; want one with the 3 new events", calls)
	}
	for _, id := range []uuid.UUID{ids[0], ids[2], ids[3]} {
		f.mustEffects(t, consumer, id, 0)
		f.mustProcessed(t, consumer, id, 0)
	}

	calls = nil
	mustBulk(t, ib, events(ids...), bulkHandler(f, &calls), inbox.BatchResult{Applied: 3, Duplicates: 1})
	for _, id := range ids {
		f.mustEffects(t, consumer, id, 1)
		f.mustProcessed(t, consumer, id, 1)
	}
}

// A panicking handler rolls the batch back and the panic goes on.
func testBulkPanic[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	a, b := newID(t), newID(t)
	func() {
		defer func() {
			if p := recover(); p != "bulk boom" {
				t.Errorf("recovered %v; want the handler's panic", p)
			}
		}()
		var calls [][]string
		_, _ = ib.ProcessBulk(t.Context(), events(a, b), func(ctx context.Context, tx TTx, fresh []inbox.Event) error {
			if err := bulkHandler(f, &calls)(ctx, tx, fresh); err != nil {
				return err
			}
			panic("bulk boom")
		})
	}()
	for _, id := range []uuid.UUID{a, b} {
		f.mustEffects(t, consumer, id, 0)
		f.mustProcessed(t, consumer, id, 0)
	}
	var calls [][]string
	mustBulk(t, ib, events(a, b), bulkHandler(f, &calls), inbox.BatchResult{Applied: 2})
}

// An event with the nil ID rejects the batch before anything is written,
// naming the event.
func testBulkNilID[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	a := newID(t)
	_, err := ib.ProcessBulk(t.Context(), events(a, uuid.Nil), func(context.Context, TTx, []inbox.Event) error {
		t.Error("handler called for a batch with a nil ID")
		return nil
	})
	var ee *inbox.EventError
	if !errors.As(err, &ee) || !errors.Is(err, inbox.ErrNilEventID) || ee.Index != 1 {
		t.Fatalf("ProcessBulk with a nil ID = %v; want an *EventError at index 1 wrapping ErrNilEventID", err)
	}
	f.mustProcessed(t, consumer, a, 0)
}

// ProcessBulkTx joins the caller's transaction, and OnResult sees both
// forms.
func testProcessBulkTx[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	var results []inbox.Result
	ib, err := inbox.New(f.drv, &inbox.Config{Consumer: consumer, OnResult: func(_ context.Context, r inbox.Result) {
		results = append(results, r)
	}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := newID(t), newID(t)
	var calls [][]string

	tx := begin(t, f)
	res, err := ib.ProcessBulkTx(ctx, tx, events(a, b, a), bulkHandler(f, &calls))
	if err != nil || res != (inbox.BatchResult{Applied: 2, Duplicates: 1}) {
		t.Fatalf("ProcessBulkTx = %+v, %v", res, err)
	}
	if err := f.drv.Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	f.mustEffects(t, consumer, a, 0)
	f.mustProcessed(t, consumer, a, 0)

	tx = begin(t, f)
	res, err = ib.ProcessBulkTx(ctx, tx, events(b, a), bulkHandler(f, &calls))
	if err != nil || res != (inbox.BatchResult{Applied: 2}) {
		t.Fatalf("ProcessBulkTx after the rollback = %+v, %v; want both applied", res, err)
	}
	commit(t, f, tx)
	f.mustEffects(t, consumer, a, 1)
	f.mustEffects(t, consumer, b, 1)
	mustBulk(t, ib, events(a, b), bulkHandler(f, &calls), inbox.BatchResult{Duplicates: 2})

	if len(results) != 3 || results[0].Applied != 2 || results[0].Duplicates != 1 || results[2].Duplicates != 2 || results[2].Events != 2 {
		t.Errorf("OnResult saw %+v; want 3 calls with their counts", results)
	}
}
