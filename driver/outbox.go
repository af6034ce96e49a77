package driver

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// OutboxRow is one event stored in the transactional outbox (table outbox).
// See package outbox for the code that writes and relays it.
type OutboxRow struct {
	// ID is the row's sequence number, assigned by the database in insert
	// order. Events of one Key are published in ID order. OutboxInsert
	// ignores it.
	ID int64

	// EventID, EventType, Key, SagaID, OccurredAt, Payload and Headers are
	// the fields of the event envelope, stored as they are so that every
	// publication of the row carries the same event ID. EventID is unique
	// in the table: enqueuing the same event twice stores it once
	// (R-DIST-IDEM-X2).
	EventID    uuid.UUID
	EventType  string
	Key        string
	SagaID     string // "" is stored as NULL
	OccurredAt time.Time
	Payload    []byte
	// Headers is the JSON object of the envelope's extra headers, or nil
	// when it has none.
	Headers []byte

	// CreatedAt is when the row was enqueued (set by the caller of
	// OutboxInsert); the lag metric measures from it.
	CreatedAt time.Time

	// Delivery state, maintained by the relay.
	Attempts int
	// LastError is the error of the last failed attempt ("" if none).
	LastError string
	// NextAttemptAt is when a failed row is retried; zero for a row that
	// never failed (it is due at once).
	NextAttemptAt time.Time
	// ParkedAt is set when the row was parked as poison (see OutboxPark);
	// zero otherwise.
	ParkedAt time.Time
	// PublishedAt is set once the row is published; zero before.
	PublishedAt time.Time
}

// OutboxExecutor is the storage of the transactional outbox (table outbox).
//
// # Per-key order and the head of a key
//
// The unpublished rows of one Key form a queue ordered by ID; its first row
// is the key's head. A key is claimable when its head is due (never failed,
// or NextAttemptAt not after now) and not parked. A head that is backing off
// or parked blocks its whole key, so the events of a key are never
// published out of order; other keys are not affected.
type OutboxExecutor interface {
	// OutboxInsert stores rows in the order given (their IDs increase in
	// that order) with INSERT ... ON CONFLICT (event_id) DO NOTHING, and
	// returns how many were new. A row whose EventID is already stored is
	// skipped, so a retried enqueue of the same operation adds nothing.
	// Backends with a wake-up channel (PostgreSQL NOTIFY) signal it in the
	// same transaction when at least one row was inserted. An empty rows
	// returns (0, nil).
	OutboxInsert(ctx context.Context, rows []OutboxRow) (inserted int, err error)

	// OutboxClaimBatch returns up to p.Limit unpublished rows to publish
	// next, ordered by ID. The rows of each key in the batch are the first
	// ones of its queue: its head and the rows following it in ID order,
	// up to (excluding) the first row of that key that is not due or is
	// parked. Which keys a batch holds when not all fit is the backend's
	// choice, but a claim whose p.Limit covers every claimable row returns
	// them all (unless p.MaxBytes cuts the batch short: see
	// OutboxClaimBatchParams.MaxBytes), and one that finds any claimable
	// row returns at least one.
	//
	// On a backend with concurrent writers (PostgreSQL) the method must run
	// in a transaction (it returns an error otherwise) that stays open
	// until the rows are marked: the claim takes keys by lanes (a fixed
	// hash of the key), locks each lane it takes until that transaction
	// ends, and skips the lanes other transactions hold, so several relays
	// never publish the same row at the same time and never interleave
	// within a key. p.HoldTimeout, if positive, bounds how long that
	// transaction may then stay idle before the server ends it (and frees
	// its locks). On SQLite there are no locks: only one relay may claim
	// at a time per database (outbox.Relay holds a lease of idem_lock
	// while it does), and the batch is the lowest IDs.
	OutboxClaimBatch(ctx context.Context, p *OutboxClaimBatchParams) ([]OutboxRow, error)

	// OutboxMarkPublished records p.At as the publication time of the
	// unpublished rows among p.IDs (PostgreSQL moves them from
	// outbox_pending to outbox_published; SQLite sets published_at). Rows
	// already published keep their first time.
	OutboxMarkPublished(ctx context.Context, p *OutboxMarkPublishedParams) error

	// OutboxMarkFailed records a failed attempt of row p.ID: attempts+1,
	// last_error = p.Error, next_attempt_at = p.NextAttempt. ErrNotFound if
	// no unpublished row has that id.
	OutboxMarkFailed(ctx context.Context, p *OutboxMarkFailedParams) error

	// OutboxPark records a last failed attempt of row p.ID (attempts+1,
	// last_error = p.Error) and parks it at p.At: the row is kept but never
	// claimed again, and it blocks the later rows of its key until an
	// operator unparks it (OutboxUnpark; see package outbox). ErrNotFound if no
	// unpublished row has that id.
	OutboxPark(ctx context.Context, p *OutboxParkParams) error

	// OutboxDeletePublishedBefore deletes at most p.Limit rows published
	// before p.Before, in (published_at, id) order from p.After on (see
	// DeleteResult), and returns how many it deleted (where publication is
	// logged in a table of its own: how many log rows, each with its event
	// unless the event is gone already) and the last one's key. Fewer than
	// p.Limit means nothing older is left after p.After. Unpublished and
	// parked rows are never deleted. p.Limit must be positive.
	OutboxDeletePublishedBefore(ctx context.Context, p *OutboxDeletePublishedBeforeParams) (DeleteResult[OutboxCursor], error)

	// OutboxOldestUnpublished returns the CreatedAt of the oldest (lowest
	// ID) unpublished row, parked rows included (a parked row is an event
	// not delivered), and false when every row is published. It feeds the
	// relay's lag metric, so it must be cheap however long the backlog is.
	OutboxOldestUnpublished(ctx context.Context) (time.Time, bool, error)

	// OutboxCountParked returns how many rows are parked now (see
	// OutboxPark): parked and not yet unparked by an operator, nor
	// published since. It feeds a "parked events" gauge that is read
	// periodically, so it must be cheap however large the outbox is: it
	// reads an index of the rows that failed (almost always empty), never
	// the whole outbox.
	OutboxCountParked(ctx context.Context) (int, error)

	// OutboxRedrive marks published rows unpublished again (publication
	// time, attempts, last_error and next_attempt_at cleared) so that the relay
	// publishes them once more, with their stored event IDs: consumers
	// with an inbox drop the copies they already applied. It is the safety
	// net for a broker that lost events it had acknowledged (a fresh
	// embedded log, a deleted topic, a failed-over cluster). It changes at
	// most p.Limit rows, the earliest published first (then the lowest
	// ID), and returns how many; call it until it returns fewer than
	// p.Limit. Each call reads about the rows it changes, through an index
	// in that order: the rows changed before it have left that order's
	// front. Rows published before p.PublishedSince or at or after
	// p.PublishedBefore are not changed (the upper bound keeps a loop from
	// redriving what the relay has just republished; see
	// OutboxLastPublished), nor are unpublished or parked rows.
	OutboxRedrive(ctx context.Context, p *OutboxRedriveParams) (int, error)

	// OutboxLastPublished returns the latest publication time recorded
	// (the p.At of OutboxMarkPublished: a relay's clock), and false when
	// no published row is kept. A redrive loop bounds itself with it
	// (OutboxRedriveParams.PublishedBefore), so that the times it compares
	// all come from the relays' clocks, whatever the caller's. It reads
	// the last entry of an index.
	OutboxLastPublished(ctx context.Context) (time.Time, bool, error)

	// OutboxLastParked returns the latest park time (the p.At of
	// OutboxPark: a relay's clock) of the rows parked now, and false when
	// none is. An unpark loop bounds itself with it
	// (OutboxUnparkParams.ParkedBefore), as a redrive with
	// OutboxLastPublished. It reads the index of the rows that failed, as
	// OutboxCountParked does.
	OutboxLastParked(ctx context.Context) (time.Time, bool, error)

	// OutboxUnpark makes parked rows claimable again, as an operator does
	// once the cause of the park is fixed: parked_at, attempts and
	// next_attempt_at are cleared (last_error is kept until the next
	// attempt), so the row is due at once and its key's later rows follow
	// it in ID order. It changes at most p.Limit rows, key by key (each
	// key's in ID order), and returns how many; call it until it returns
	// fewer than p.Limit. Each call reads about the rows it changes,
	// through the index of the rows that failed, which the rows changed
	// before it have left.
	// Only rows parked now are changed: pending rows, rows backing off,
	// published rows and unknown event IDs are not (they do not count).
	// The rows are selected by p.EventIDs, p.Keys and p.ParkedBefore
	// together; with none of them set, every parked row is.
	OutboxUnpark(ctx context.Context, p *OutboxUnparkParams) (int, error)

	// OutboxRetryNow makes rows that are backing off after a failed
	// attempt due at p.At: those whose next_attempt_at is after p.At get
	// p.At (attempts and last_error are kept). Parked, published and never
	// failed rows are not changed, nor are rows another transaction holds
	// locked (a relay's claim or its marks: they are being retried now).
	// The relay calls it when the broker is back after an outage, so that
	// the events that failed during it do not wait out their backoff. It
	// changes at most p.Limit rows and returns how many; call it until it
	// returns fewer than p.Limit. It reads the index of the rows that
	// failed (as OutboxCountParked), never the whole outbox.
	OutboxRetryNow(ctx context.Context, p *OutboxRetryNowParams) (int, error)
}

// OutboxRetryNowParams selects the rows of OutboxRetryNow.
type OutboxRetryNowParams struct {
	// At is the new retry time (the relay's clock, as for
	// OutboxMarkFailedParams.NextAttempt).
	At time.Time
	// Limit is the most rows changed by one call; it must be positive.
	Limit int
}

// OutboxUnparkParams selects the rows of OutboxUnpark.
type OutboxUnparkParams struct {
	// EventIDs, when not empty, limits the unpark to the rows of these
	// event IDs.
	EventIDs []uuid.UUID
	// Keys, when not empty, limits the unpark to rows of these keys.
	Keys []string
	// ParkedBefore, when not zero, excludes rows parked at or after it
	// (a loop's upper bound, as OutboxRedriveParams.PublishedBefore: take
	// it from OutboxLastParked, the relays' clock, not the caller's).
	ParkedBefore time.Time
	// Limit is the most rows changed by one call; it must be positive.
	Limit int
}

// OutboxRedriveParams selects the rows of OutboxRedrive.
type OutboxRedriveParams struct {
	// PublishedSince is the earliest publication time redriven; zero
	// means every retained row.
	PublishedSince time.Time
	// PublishedBefore excludes rows published at or after it; it must
	// not be zero. Publication times are the relays' clocks: a loop takes
	// it from OutboxLastPublished, not from its own clock, which may be
	// behind theirs (it would miss the latest publications) or ahead (it
	// would redrive the relays' republications again).
	PublishedBefore time.Time
	// Keys, when not empty, limits the redrive to rows of these keys.
	Keys []string
	// Limit is the most rows changed by one call; it must be positive.
	Limit int
}
