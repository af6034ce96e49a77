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
	// uncommitted claim of the same key (PostgreSQL). Zero means the
	// backend default (wait for the statement timeout).
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
	// RecordGet returns the record, live or not, or ErrNotFound.
	RecordGet(ctx context.Context, scope, key string) (*Record, error)
	// RecordComplete stores the response of an in-progress record owned by
	// p.LeaseToken and marks it completed. ErrLeaseLost if not owned.
	RecordComplete(ctx context.Context, p *RecordCompleteParams) error
	// RecordRelease deletes an in-progress record owned by token, so that a
	// retry may execute. ErrLeaseLost if not owned.
	RecordRelease(ctx context.Context, scope, key, token string) error
	// RecordExtendLease moves the lease of an owned in-progress record to
	// until. ErrLeaseLost if not owned.
	RecordExtendLease(ctx context.Context, scope, key, token string, until time.Time) error
	// RecordDeleteExpired deletes at most limit records whose ExpiresAt is
	// not after now and returns how many it deleted.
	RecordDeleteExpired(ctx context.Context, now time.Time, limit int) (int, error)
}
