package driver

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
)

// InboxExecutor is the storage of the consumer inbox (table processed_event,
// rule R-DIST-IDEM-2). See package inbox for the code that uses it.
//
// A row (consumer_name, event_id) says that consumer has applied the event.
// The key is the pair (consumer_name, event_id), not event_id alone:
// several consumers (projections, services sharing a database)
// each process the same event once.
type InboxExecutor interface {
	// InboxInsert records p.IDs as processed by p.Consumer at p.Now, with one
	// INSERT for the batch (pgdriver: a plain INSERT in a savepoint, and,
	// only when an id was recorded before, INSERT ... ON CONFLICT DO
	// NOTHING RETURNING after it), and returns the ids that were not
	// recorded yet: exactly the ones the caller must now apply. An id given twice in p.IDs is returned at most once.
	// The order of the result is unspecified. It never reads before writing, so
	// concurrent callers cannot both see an id as new: on a backend with
	// concurrent writers, a caller inserting an id that an uncommitted
	// transaction inserted waits for that transaction, then gets the id
	// back only if it rolled back. An empty p.IDs returns (nil, nil).
	InboxInsert(ctx context.Context, p *InboxInsertParams) (inserted []uuid.UUID, err error)

	// InboxDeleteBefore deletes at most p.Limit rows of p.Consumer ("" for
	// every consumer) whose processed_at is before p.Before, oldest first in
	// (processed_at, consumer_name, event_id) order from p.After on (see
	// DeleteResult), and returns how many it deleted and the last one's key.
	// The cleaner calls it in a loop, each call with the Last of the one
	// before, until it deletes less than p.Limit. p.Limit must be positive.
	InboxDeleteBefore(ctx context.Context, p *InboxDeleteBeforeParams) (DeleteResult[InboxCursor], error)

	// InboxOldest returns the smallest processed_at over all consumers, and
	// false when the table is empty (a metric of how far cleanup lags).
	InboxOldest(ctx context.Context) (time.Time, bool, error)
}

// SortedUniqueIDs returns the distinct ids in ascending byte order (the order
// of PostgreSQL's uuid type and of the canonical text form). Drivers insert
// a batch in this order, so two transactions with overlapping batches take
// their row locks in the same order and cannot deadlock each other.
func SortedUniqueIDs(ids []uuid.UUID) []uuid.UUID {
	out := slices.Clone(ids)
	slices.SortFunc(out, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return slices.Compact(out)
}
