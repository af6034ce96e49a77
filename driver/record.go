package driver

import (
	"context"
	"time"
)

// Record states.
const (
	// StateInProgress: the key is claimed and its command is executing.
	StateInProgress = "in_progress"
	// StateCompleted: the command finished and its response is stored.
	StateCompleted = "completed"
)

// Record is a stored idempotency record (table idempotency_record).
type Record struct {
	Scope       string
	Key         string
	Fingerprint []byte
	State       string
	// Status, Headers and Body are set once State is StateCompleted.
	// Headers is the JSON encoding of the replayable headers.
	Status  int
	Headers []byte
	Body    []byte
	// LeaseToken and LeaseExpiresAt identify the owner of an in-progress
	// record.
	LeaseToken     string
	LeaseExpiresAt time.Time
	CreatedAt      time.Time
	ExpiresAt      time.Time
}

// RecordClaimParams are the inputs of RecordExecutor.RecordClaim.
type RecordClaimParams struct {
	Scope       string
	Key         string
	Fingerprint []byte
	// LeaseToken identifies the claimant; it must be unique per attempt.
	LeaseToken string
	// LeaseExpiresAt: until when the claim is held without renewal.
	LeaseExpiresAt time.Time
	// Now is the current time. A record whose ExpiresAt is not after Now is
	// treated as absent and replaced; an in-progress record whose
	// LeaseExpiresAt is not after Now and whose fingerprint equals
	// Fingerprint is abandoned and taken over.
	Now time.Time
	// ExpiresAt: when the record stops deduplicating.
	ExpiresAt time.Time
	// LockTimeout bounds how long the claim waits for a concurrent,
	// uncommitted claim of the same key (PostgreSQL): the session's
	// statement_timeout is off for that wait, so that a shorter one does
	// not cut it short. Zero means the backend default (wait for the
	// statement timeout).
	LockTimeout time.Duration
}

// RecordClaimResult is the outcome of a claim.
type RecordClaimResult struct {
	// Claimed is true when the caller now owns the key: no record existed,
	// or an expired one was replaced, or an abandoned in-progress one (lease
	// expired, same fingerprint) was taken over.
	Claimed bool
	// Existing is the live record when Claimed is false.
	Existing *Record
}

// RecordCompleteParams store the outcome of a claimed command.
type RecordCompleteParams struct {
	Scope      string
	Key        string
	LeaseToken string
	Status     int
	Headers    []byte
	Body       []byte
}

// RecordExecutor is the storage of HTTP idempotency records.
type RecordExecutor interface {
	// RecordClaim atomically claims (scope, key): it inserts an in-progress
	// record, or takes over an expired or abandoned one, or returns the live
	// record. It never executes a check-then-insert.
	RecordClaim(ctx context.Context, p *RecordClaimParams) (*RecordClaimResult, error)
	// RecordGet returns the record (p.Scope, p.Key), live or not, or
	// ErrNotFound.
	RecordGet(ctx context.Context, p *RecordGetParams) (*Record, error)
	// RecordComplete stores the response of an in-progress record owned by
	// p.LeaseToken and marks it completed. ErrLeaseLost if not owned.
	RecordComplete(ctx context.Context, p *RecordCompleteParams) error
	// RecordRelease deletes an in-progress record owned by p.LeaseToken, so that a
	// retry may execute. ErrLeaseLost if not owned.
	RecordRelease(ctx context.Context, p *RecordReleaseParams) error
	// RecordExtendLease moves the lease of an in-progress record owned by
	// p.LeaseToken to p.Until. ErrLeaseLost if not owned.
	RecordExtendLease(ctx context.Context, p *RecordExtendLeaseParams) error
	// RecordDeleteExpired deletes at most p.Limit records whose ExpiresAt is
	// not after p.Now, in (expires_at, scope, idempotency_key) order from
	// p.After on (see DeleteResult), and returns how many it deleted and
	// the last one's key. p.Limit must be positive.
	RecordDeleteExpired(ctx context.Context, p *RecordDeleteExpiredParams) (DeleteResult[RecordCursor], error)
}

// TxClaimer is implemented by backends that run idemhttp's ModeTx in as few
// round trips as the handler alone: the transaction begins together with
// the claim, and the completed record is written together with the commit,
// once (no in-progress row, no update). idemhttp uses it when the driver has
// it, and Begin + RecordClaim + RecordComplete + Commit otherwise.
//
// The protocol: BeginClaim begins a transaction that holds a lock on
// (scope, key) until it ends and returns the record as committed before the
// lock was taken; the caller runs the command in that transaction and calls
// CommitComplete, or rolls the transaction back. The unique index on
// (scope, key) stays the safety net: CommitComplete fails with ErrLeaseLost,
// and rolls everything back, when another writer stored the key meanwhile
// (a ModeLease claim, which takes no such lock).
type TxClaimer[TTx any] interface {
	// BeginClaim begins a read-write transaction and locks (scope, key) in
	// it, waiting at most p.Wait (zero: not at all). When the lock is
	// taken, Result.Record is the key's record (nil if none), read after
	// the lock. When it is not, Locked is false and the transaction has
	// been rolled back (tx is the zero value); Record is then nil, or,
	// when p.Now is set and the key holds a completed record live at
	// p.Now, that record: a backend may answer it without taking the lock
	// or opening a transaction (a completed record does not change until
	// it expires), and the caller replays it (or answers the mismatch).
	// A backend with concurrent writers answers it so, at least, when the
	// lock is held by another transaction (a concurrent retry of the
	// completed request) and p.Wait is zero: drivertest checks it.
	BeginClaim(ctx context.Context, p *TxClaimParams) (tx TTx, res *TxClaimResult, err error)
	// CommitComplete stores the completed record in tx and commits tx.
	// With p.Replace it replaces the existing record, which must still be
	// expired (ExpiresAt not after p.CreatedAt) or in progress with a lease
	// expired before p.CreatedAt and the same fingerprint, or inserts it if
	// that record was deleted meanwhile (by the retention sweep); without
	// p.Replace it inserts. On any error tx is rolled back; ErrLeaseLost says the key
	// was stored by someone else (nothing of tx was committed); ErrTxAborted
	// that a statement run in tx failed (or a deferred constraint at
	// COMMIT), so nothing was committed; ErrTxDone that tx had been ended
	// by the code run in it (and, if the error is also ErrTxAborted, that
	// nothing of it was committed).
	CommitComplete(ctx context.Context, tx TTx, p *TxCompleteParams) error
}

// TxClaimParams are the inputs of TxClaimer.BeginClaim.
type TxClaimParams struct {
	Scope string
	Key   string
	// Wait bounds the wait for the lock (on PostgreSQL a lock_timeout,
	// with the session's statement_timeout off for the wait); zero tries
	// once.
	Wait time.Duration
	// Now, when not zero, lets BeginClaim answer a key with a completed
	// record live at Now without the lock (see BeginClaim).
	Now time.Time
}

// TxClaimResult is the outcome of TxClaimer.BeginClaim.
type TxClaimResult struct {
	// Locked is true when the transaction holds the key's lock.
	Locked bool
	// Record is the key's record, live or not, in any state; nil if none.
	Record *Record
}

// TxCompleteParams is the completed record of TxClaimer.CommitComplete.
type TxCompleteParams struct {
	Scope       string
	Key         string
	Fingerprint []byte
	Status      int
	Headers     []byte
	Body        []byte
	CreatedAt   time.Time
	ExpiresAt   time.Time
	// Replace: BeginClaim returned a record that is expired or abandoned.
	Replace bool
}
