package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Event is one event of a batch: its ID, which the inbox deduplicates on,
// and whatever the handler needs, which the inbox does not look at (a
// decoded event.Envelope, a Kafka record, ...).
type Event struct {
	ID      uuid.UUID
	Payload any
}

// BatchResult counts what a batch did. Applied + Duplicates is the number
// of events given.
type BatchResult struct {
	// Applied events had their handler run (and, for ProcessBatch, their
	// effects committed).
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
// event and process the others again, or retry the batch. Other errors come
// from the database and leave nothing applied, except a failed COMMIT, whose
// outcome is unknown; redelivering the batch is always safe. An empty batch
// does nothing.
func (ib *Inbox[TTx]) ProcessBatch(ctx context.Context, events []Event, fn func(ctx context.Context, tx TTx, e Event) error) (BatchResult, error) {
	started := time.Now()
	res, err := ib.processBatch(ctx, events, fn)
	ib.report(ctx, len(events), res, err, started)
	return res, err
}

// ProcessBatchTx is ProcessBatch inside the caller's transaction tx. It
// never commits nor rolls back. If it returns an error the caller must roll
// tx back: tx holds the dedup rows of events whose effects did not all
// happen.
func (ib *Inbox[TTx]) ProcessBatchTx(ctx context.Context, tx TTx, events []Event, fn func(ctx context.Context, tx TTx, e Event) error) (BatchResult, error) {
	started := time.Now()
	res, err := ib.apply(ctx, tx, events, fn)
	ib.report(ctx, len(events), res, err, started)
	return res, err
}

// processBatch runs apply in a transaction of its own and commits it when
// something was applied. On an error or a panic it rolls back.
func (ib *Inbox[TTx]) processBatch(ctx context.Context, events []Event, fn func(ctx context.Context, tx TTx, e Event) error) (BatchResult, error) {
	if len(events) == 0 {
		return BatchResult{}, nil
	}
	if err := checkIDs(events); err != nil {
		return BatchResult{}, err
	}
	tx, err := ib.drv.Begin(ctx)
	if err != nil {
		return BatchResult{}, fmt.Errorf("inbox: %w", err)
	}
	ended := false
	defer func() {
		if !ended { // an error or a panic: undo everything
			ib.rollback(ctx, tx)
		}
	}()
	res, err := ib.apply(ctx, tx, events, fn)
	if err != nil {
		return BatchResult{}, err
	}
	ended = true
	if res.Applied == 0 { // only duplicates: nothing to commit
		ib.rollback(ctx, tx)
		return res, nil
	}
	// The effects are done: commit them even if ctx was cancelled meanwhile.
	if err := ib.drv.Commit(context.WithoutCancel(ctx), tx); err != nil {
		ib.rollback(ctx, tx)
		return BatchResult{}, fmt.Errorf("inbox: commit (outcome unknown, redelivery is safe): %w", err)
	}
	return res, nil
}

// apply records the events' IDs in tx with one statement and calls fn for
// each new event, in input order.
func (ib *Inbox[TTx]) apply(ctx context.Context, tx TTx, events []Event, fn func(ctx context.Context, tx TTx, e Event) error) (BatchResult, error) {
	if len(events) == 0 {
		return BatchResult{}, nil
	}
	if err := checkIDs(events); err != nil {
		return BatchResult{}, err
	}
	ids := make([]uuid.UUID, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	inserted, err := ib.drv.UnwrapExecutor(tx).InboxInsert(ctx, ib.cfg.Consumer, ids, ib.cfg.Now())
	if err != nil {
		return BatchResult{}, fmt.Errorf("inbox: record events: %w", err)
	}
	pending := make(map[uuid.UUID]struct{}, len(inserted))
	for _, id := range inserted {
		pending[id] = struct{}{}
	}
	var res BatchResult
	for i, e := range events {
		if _, ok := pending[e.ID]; !ok {
			res.Duplicates++
			ib.cfg.Logger.DebugContext(ctx, "inbox: duplicate event skipped", "consumer", ib.cfg.Consumer, "event_id", e.ID, "index", i)
			continue
		}
		delete(pending, e.ID) // a later copy in this batch is a duplicate
		if err := fn(ctx, tx, e); err != nil {
			return BatchResult{}, &EventError{ID: e.ID, Index: i, Err: err}
		}
		res.Applied++
	}
	return res, nil
}

func checkIDs(events []Event) error {
	for i, e := range events {
		if e.ID == uuid.Nil {
			return &EventError{ID: e.ID, Index: i, Err: ErrNilEventID}
		}
	}
	return nil
}
