package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/txbegin"
	"github.com/idemkit/idem/internal/txnil"
)

// Event is one event of a batch: its ID, which the inbox deduplicates on,
// and whatever the handler needs, which the inbox does not look at (a
// decoded event.Envelope, a Kafka record, ...).
type Event struct {
	ID      uuid.UUID
	Payload any
	// Headers, if set, are the event's headers (event.Envelope.Headers;
	// idemkafka sets them). The inbox reads only the trace context in them
	// (traceparent, tracestate), and only with Config.Tracer.
	Headers map[string]string
}

// BatchResult counts what a batch did. Applied + Duplicates is the number
// of events given.
type BatchResult struct {
	// Applied events had their handler run (and, for ProcessBatch and
	// ProcessBulk, their effects committed).
	Applied int
	// Duplicates were skipped: processed before, or an earlier event of the
	// same batch had the same ID.
	Duplicates int
}

// ProcessBatch applies a batch of events in ONE transaction: one statement
// records all their IDs for the consumer, then fn runs for each event that
// was new, in input order, with the transaction; then it commits. Events
// already processed, and later copies of an ID within the batch, are
// skipped.
//
// If fn fails for an event (or an event has the nil ID), the whole batch
// rolls back, nothing of it is committed, and the error is an *EventError
// with that event's ID and index in events: the caller can dead-letter that
// event and process the others again, or retry the batch. When ctx ended
// while fn ran (errors.Is(err, ctx.Err()) is true, typically a shutdown),
// the *EventError names the event that happened to be running, not a
// faulty one: retry the batch later, don't dead-letter it. Other errors come
// from the database and leave nothing applied, except a failed COMMIT, whose
// outcome is unknown; redelivering the batch is always safe. An empty batch
// does nothing.
func (ib *Inbox[TTx]) ProcessBatch(ctx context.Context, events []Event, fn func(ctx context.Context, tx TTx, e Event) error) (res BatchResult, err error) {
	ctx, span := ib.startSpan(ctx, "ProcessBatch", events)
	defer endSpan(span, &res, &err)
	started := time.Now()
	res, err = ib.processBatch(ctx, events, ib.traced(fn))
	ib.report(ctx, len(events), res, err, started)
	return res, err
}

// ProcessBatchTx is ProcessBatch inside the caller's transaction tx. It
// never commits nor rolls back. If it returns an error the caller must roll
// tx back: tx holds the dedup rows of events whose effects did not all
// happen.
func (ib *Inbox[TTx]) ProcessBatchTx(ctx context.Context, tx TTx, events []Event, fn func(ctx context.Context, tx TTx, e Event) error) (res BatchResult, err error) {
	if txnil.Is(tx) {
		return BatchResult{}, errNilTx
	}
	ctx, span := ib.startSpan(ctx, "ProcessBatchTx", events)
	defer endSpan(span, &res, &err)
	started := time.Now()
	res, err = ib.apply(ctx, tx, events, ib.traced(fn))
	ib.report(ctx, len(events), res, err, started)
	return res, err
}

// ProcessBulk is ProcessBatch with a handler that receives all the new
// events of the batch at once: one statement records all the IDs, then fn
// runs ONCE with the events that were new (not processed before, first copy
// of each ID within the batch), in input order, and the transaction, so it
// can apply their effects with one bulk statement (a multi-row INSERT, COPY)
// instead of one round trip per event; then it commits. fn is not called
// when no event is new (nothing is written then). fresh is a new slice fn
// may keep.
//
// If fn fails (or panics), the whole batch rolls back, no dedup row is
// committed, and the error is a *BulkError wrapping fn's error (the panic
// goes on). Unlike ProcessBatch's *EventError it cannot name the event at
// fault: to find it, process the events again one at a time (ProcessBulk
// with one event each, or ProcessBatch). An event with the nil ID is
// rejected before anything is written, with an *EventError naming it, as in
// ProcessBatch. Other errors come from the database and leave nothing
// applied, except a failed COMMIT, whose outcome is unknown; redelivering
// the batch is always safe. An empty batch does nothing.
//
// Use ProcessBulk when the handler's effect can be written for many events
// in one statement; use ProcessBatch when the handler works event by event
// (it then names the failing event).
func (ib *Inbox[TTx]) ProcessBulk(ctx context.Context, events []Event, fn func(ctx context.Context, tx TTx, fresh []Event) error) (res BatchResult, err error) {
	ctx, span := ib.startSpan(ctx, "ProcessBulk", events)
	defer endSpan(span, &res, &err)
	started := time.Now()
	res, err = ib.inTx(ctx, events, func(ctx context.Context, tx TTx) (BatchResult, error) {
		return ib.applyBulk(ctx, tx, events, fn)
	})
	ib.report(ctx, len(events), res, err, started)
	return res, err
}

// ProcessBulkTx is ProcessBulk inside the caller's transaction tx. It never
// commits nor rolls back. If it returns an error the caller must roll tx
// back: tx holds the dedup rows of events whose effects did not all happen.
func (ib *Inbox[TTx]) ProcessBulkTx(ctx context.Context, tx TTx, events []Event, fn func(ctx context.Context, tx TTx, fresh []Event) error) (res BatchResult, err error) {
	if txnil.Is(tx) {
		return BatchResult{}, errNilTx
	}
	ctx, span := ib.startSpan(ctx, "ProcessBulkTx", events)
	defer endSpan(span, &res, &err)
	started := time.Now()
	res, err = ib.applyBulk(ctx, tx, events, fn)
	ib.report(ctx, len(events), res, err, started)
	return res, err
}

// BulkError is the error of ProcessBulk and ProcessBulkTx when their
// handler failed. Nothing of the batch was committed. It does not say which
// event was at fault; errors.Is and errors.As see through it to the
// handler's error.
type BulkError struct {
	// Events is how many new events the handler was given.
	Events int
	// Err is the handler's error.
	Err error
}

func (e *BulkError) Error() string {
	return fmt.Sprintf("inbox: handler of %d events: %v", e.Events, e.Err)
}

// Unwrap returns the handler's error.
func (e *BulkError) Unwrap() error { return e.Err }

// processBatch runs apply in a transaction of its own and commits it when
// something was applied. On an error or a panic it rolls back.
func (ib *Inbox[TTx]) processBatch(ctx context.Context, events []Event, fn func(ctx context.Context, tx TTx, e Event) error) (BatchResult, error) {
	return ib.inTx(ctx, events, func(ctx context.Context, tx TTx) (BatchResult, error) {
		return ib.apply(ctx, tx, events, fn)
	})
}

// inTx runs run (apply or applyBulk of events) in a transaction of its own
// and commits it when something was applied. On an error or a panic it
// rolls back.
func (ib *Inbox[TTx]) inTx(ctx context.Context, events []Event, run func(ctx context.Context, tx TTx) (BatchResult, error)) (BatchResult, error) {
	if len(events) == 0 {
		return BatchResult{}, nil
	}
	if err := checkIDs(events); err != nil {
		return BatchResult{}, err
	}
	tx, endBegin, err := txbegin.Begin(ctx, ib.drv.Begin, func(tx TTx) { ib.rollback(ctx, tx) })
	if err != nil {
		return BatchResult{}, fmt.Errorf("inbox: %w", err)
	}
	defer endBegin()
	ended := false
	defer func() {
		if !ended { // an error or a panic: undo everything
			ib.rollback(ctx, tx)
		}
	}()
	res, err := run(ctx, tx)
	if err != nil {
		return BatchResult{}, err
	}
	ended = true
	if res.Applied == 0 { // only duplicates: nothing to commit
		ib.rollback(ctx, tx)
		return res, nil
	}
	// The effects are done: commit them even if ctx was cancelled meanwhile
	// (with pgx; database/sql has already rolled back a transaction whose
	// context ended, and the commit then fails: nothing applied), but give
	// up commitGrace after ctx ended, so a hung COMMIT cannot block for ever.
	cctx, stop := commitContext(ctx)
	err = ib.drv.Commit(cctx, tx)
	stop()
	if err != nil {
		ib.rollback(ctx, tx)
		if errors.Is(err, driver.ErrTxAborted) {
			// The database answered: the transaction rolled back.
			return BatchResult{}, fmt.Errorf("inbox: commit refused, nothing applied: %w", err)
		}
		return BatchResult{}, fmt.Errorf("inbox: commit (outcome unknown, redelivery is safe): %w", err)
	}
	return res, nil
}

// apply records the events' IDs in tx with one statement and calls fn for
// each new event, in input order.
func (ib *Inbox[TTx]) apply(ctx context.Context, tx TTx, events []Event, fn func(ctx context.Context, tx TTx, e Event) error) (BatchResult, error) {
	fresh, err := ib.record(ctx, tx, events)
	if err != nil {
		return BatchResult{}, err
	}
	for _, i := range fresh {
		if err := fn(ctx, tx, events[i]); err != nil {
			return BatchResult{}, &EventError{ID: events[i].ID, Index: i, Err: err}
		}
	}
	return BatchResult{Applied: len(fresh), Duplicates: len(events) - len(fresh)}, nil
}

// applyBulk records the events' IDs in tx with one statement and calls fn
// once with the new events, in input order, if there are any.
func (ib *Inbox[TTx]) applyBulk(ctx context.Context, tx TTx, events []Event, fn func(ctx context.Context, tx TTx, fresh []Event) error) (BatchResult, error) {
	idx, err := ib.record(ctx, tx, events)
	if err != nil {
		return BatchResult{}, err
	}
	if len(idx) > 0 {
		fresh := make([]Event, len(idx))
		for j, i := range idx {
			fresh[j] = events[i]
		}
		if err := fn(ctx, tx, fresh); err != nil {
			return BatchResult{}, &BulkError{Events: len(fresh), Err: err}
		}
	}
	return BatchResult{Applied: len(idx), Duplicates: len(events) - len(idx)}, nil
}

// record inserts the events' IDs in tx with one statement and returns the
// indexes, in input order, of the new events: those whose ID it inserted,
// first copy of each. The others are duplicates.
func (ib *Inbox[TTx]) record(ctx context.Context, tx TTx, events []Event) ([]int, error) {
	if len(events) == 0 {
		return nil, nil
	}
	if err := checkIDs(events); err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	inserted, err := ib.drv.InboxTx(tx).InboxInsert(ctx, &driver.InboxInsertParams{Consumer: ib.cfg.Consumer, IDs: ids, Now: ib.cfg.Now()})
	if err != nil {
		return nil, fmt.Errorf("inbox: record events: %w", err)
	}
	if len(inserted) == len(events) {
		// Every id was inserted: all the events are new and their ids
		// distinct (inserted holds each id at most once). The common case,
		// without building the set below.
		fresh := make([]int, len(events))
		for i := range fresh {
			fresh[i] = i
		}
		return fresh, nil
	}
	pending := make(map[uuid.UUID]struct{}, len(inserted))
	for _, id := range inserted {
		pending[id] = struct{}{}
	}
	fresh := make([]int, 0, len(inserted))
	for i, e := range events {
		if _, ok := pending[e.ID]; !ok {
			ib.cfg.Logger.DebugContext(ctx, "inbox: duplicate event skipped", "consumer", ib.cfg.Consumer, "event_id", e.ID, "index", i)
			continue
		}
		delete(pending, e.ID) // a later copy in this batch is a duplicate
		fresh = append(fresh, i)
	}
	return fresh, nil
}

func checkIDs(events []Event) error {
	for i, e := range events {
		if e.ID == uuid.Nil {
			return &EventError{ID: e.ID, Index: i, Err: ErrNilEventID}
		}
	}
	return nil
}
