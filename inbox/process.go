package inbox

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/internal/txnil"
)

// Process applies the event eventID once: in a new transaction it records
// the event for the consumer and, if it was not recorded yet, calls fn with
// that transaction and commits. It returns applied == true when fn ran and
// its effect committed with the dedup row, and (false, nil) for a duplicate,
// in which case fn is not called and nothing is written.
//
// fn must write its effect through tx. If fn returns an error or panics, the
// transaction rolls back (the dedup row disappears with the effect, so a
// redelivery applies the event) and Process returns an *EventError wrapping
// fn's error, or lets the panic go on. Any other error (the database) also
// means nothing was applied, except a failed COMMIT, whose outcome is
// unknown; in every case redelivering the event is the right reaction.
//
// A ctx that ends after fn returned does not undo the effect: with pgx the
// COMMIT still runs, but for at most 5 s more, after which it is cancelled
// (a failed COMMIT), so a hung database cannot block the caller for ever.
// (database/sql rolls back a transaction whose context ended: nothing is
// applied then.) The same holds for ProcessBatch and ProcessBulk.
//
// A concurrent Process of the same event waits for this one's transaction
// (PostgreSQL waits on the primary key, SQLite for the write lock) and then
// skips, or applies if this one rolled back.
func (ib *Inbox[TTx]) Process(ctx context.Context, eventID uuid.UUID, fn func(ctx context.Context, tx TTx) error) (applied bool, err error) {
	started := time.Now()
	events := []Event{{ID: eventID}}
	ctx, span := ib.startSpan(ctx, "Process", events)
	var res BatchResult
	defer endSpan(span, &res, &err)
	res, err = ib.processBatch(ctx, events, func(ctx context.Context, tx TTx, _ Event) error { return fn(ctx, tx) })
	ib.report(ctx, 1, res, err, started)
	return res.Applied == 1, err
}

// ProcessTx is Process inside the caller's transaction tx: it records the
// event in tx and, if it is new, calls fn with tx. It never commits nor rolls
// back; the event counts as processed once the caller commits tx.
//
// If ProcessTx returns an error the caller must roll tx back: tx holds the
// dedup row of an event whose effect failed, and committing it would mark
// the event processed without its effect. A duplicate, (false, nil), writes
// nothing and leaves tx usable. A nil tx (a transaction not threaded
// through) is refused with an error, before fn; so it is by ProcessBatchTx
// and ProcessBulkTx.
func (ib *Inbox[TTx]) ProcessTx(ctx context.Context, tx TTx, eventID uuid.UUID, fn func(ctx context.Context, tx TTx) error) (applied bool, err error) {
	if txnil.Is(tx) {
		return false, errNilTx
	}
	started := time.Now()
	events := []Event{{ID: eventID}}
	ctx, span := ib.startSpan(ctx, "ProcessTx", events)
	var res BatchResult
	defer endSpan(span, &res, &err)
	res, err = ib.apply(ctx, tx, events, func(ctx context.Context, tx TTx, _ Event) error { return fn(ctx, tx) })
	ib.report(ctx, 1, res, err, started)
	return res.Applied == 1, err
}
