package driver

import (
	"time"

	"github.com/google/uuid"
)

// DeleteResult is what one batch of a retention delete did.
//
// The retention deletes (RecordDeleteExpired, InboxDeleteBefore,
// OutboxDeletePublishedBefore, SagaDeleteFinishedBefore) run in batches:
// each call deletes at most Limit rows, oldest first, and the caller calls
// again while a call deletes Limit rows. The rows are taken in a total
// order, the time column of the table's retention index and then columns
// that make the key unique (RecordCursor, InboxCursor, OutboxCursor,
// SagaCursor), and each call returns the key of the last row it deleted.
// The next batch of the same sweep passes it back as After and resumes
// there: the database reads the index from that key on, instead of from
// its start.
//
// That matters on PostgreSQL, where the entries of deleted rows stay in
// the index until VACUUM removes them, and VACUUM cannot remove them while
// any transaction holds a snapshot older than the delete (a long report, a
// replica with hot_standby_feedback, a stuck consumer). A batch that starts
// from the beginning of the index then walks over every entry the earlier
// batches of the sweep deleted: a sweep of N rows in batches of n reads
// about N²/2n entries. Resuming after the last key reads about N.
//
// A row that becomes eligible behind the cursor during a sweep (its time
// moved into the past, or it was skipped because another transaction held
// it locked) is left for the next sweep, which starts from the zero cursor.
type DeleteResult[C any] struct {
	// Deleted is how many rows the batch deleted. Fewer than the batch's
	// Limit means no eligible row is left after the cursor (none that
	// another transaction did not hold, on a backend that skips those).
	Deleted int
	// Last is the key of the last row the batch deleted, in the order of
	// the delete: the After of the next batch of the same sweep. It is
	// the batch's After when the batch deleted nothing.
	Last C
}

// RecordCursor is a position in idempotency_record, in (expires_at, scope,
// idempotency_key) order. The zero value is the start.
type RecordCursor struct {
	ExpiresAt time.Time
	Scope     string
	Key       string
}

// IsZero reports whether c is the start.
func (c RecordCursor) IsZero() bool { return c.ExpiresAt.IsZero() && c.Scope == "" && c.Key == "" }

// InboxCursor is a position in processed_event, in (processed_at,
// consumer_name, event_id) order. The zero value is the start.
type InboxCursor struct {
	ProcessedAt time.Time
	Consumer    string
	EventID     uuid.UUID
}

// IsZero reports whether c is the start.
func (c InboxCursor) IsZero() bool {
	return c.ProcessedAt.IsZero() && c.Consumer == "" && c.EventID == uuid.Nil
}

// OutboxCursor is a position in the published outbox rows, in
// (published_at, id) order. The zero value is the start.
type OutboxCursor struct {
	PublishedAt time.Time
	ID          int64
}

// IsZero reports whether c is the start.
func (c OutboxCursor) IsZero() bool { return c.PublishedAt.IsZero() && c.ID == 0 }

// SagaCursor is a position in the finished sagas, in (finished_at, saga_id)
// order. The zero value is the start.
type SagaCursor struct {
	FinishedAt time.Time
	SagaID     string
}

// IsZero reports whether c is the start.
func (c SagaCursor) IsZero() bool { return c.FinishedAt.IsZero() && c.SagaID == "" }
