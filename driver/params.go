package driver

import (
	"time"

	"github.com/google/uuid"
)

// Every Executor method takes its inputs in one struct (a *...Params, or a
// row such as OutboxRow and Saga), so that a field added later breaks no
// backend and no caller. The fields are described by the method's
// documentation; the structs are listed here by table.

// InboxInsertParams are the inputs of InboxExecutor.InboxInsert.
type InboxInsertParams struct {
	Consumer string
	IDs      []uuid.UUID
	Now      time.Time
}

// InboxDeleteBeforeParams are the inputs of InboxExecutor.InboxDeleteBefore
// (and of pgdriver's DeleteInboxDefaultBefore).
type InboxDeleteBeforeParams struct {
	// Consumer is "" for every consumer.
	Consumer string
	Before   time.Time
	Limit    int
	// After is the Last of the previous batch of the same sweep: only rows
	// after it in (processed_at, consumer_name, event_id) order are
	// deleted. The zero value starts from the oldest row.
	After InboxCursor
}

// LockAcquireParams are the inputs of LockExecutor.LockAcquire.
type LockAcquireParams struct {
	Name  string
	Owner string
	Now   time.Time
	Until time.Time
}

// LockRenewParams are the inputs of LockExecutor.LockRenew.
type LockRenewParams struct {
	Name  string
	Owner string
	Until time.Time
}

// LockReleaseParams are the inputs of LockExecutor.LockRelease.
type LockReleaseParams struct {
	Name  string
	Owner string
}

// LockGetParams are the inputs of LockExecutor.LockGet.
type LockGetParams struct {
	Name string
}

// OutboxClaimBatchParams are the inputs of OutboxExecutor.OutboxClaimBatch.
type OutboxClaimBatchParams struct {
	Now   time.Time
	Limit int
	// HoldTimeout, if positive, bounds how long the claiming transaction
	// may then stay idle (between two statements: while the batch is
	// published) on a backend whose claim holds locks: on PostgreSQL the
	// claim sets idle_in_transaction_session_timeout for its transaction
	// (SET LOCAL), so the server ends a stalled relay's session and frees
	// its lanes. Zero leaves the session's setting.
	HoldTimeout time.Duration
	// MaxBytes, if positive, bounds the payload bytes of the batch, so
	// that a backlog of large events is not read into memory Limit events
	// at a time: taking the rows in the order the backend reads them (ID
	// order on SQLite; lane after lane on PostgreSQL, each key's in ID
	// order), it stops before the first one that would bring the sum of
	// the payloads over MaxBytes. The first row is always taken (an event
	// larger than MaxBytes is claimed alone), and each key's rows are
	// still the first ones of its queue. Zero bounds nothing.
	MaxBytes int
}

// OutboxMarkPublishedParams are the inputs of
// OutboxExecutor.OutboxMarkPublished.
type OutboxMarkPublishedParams struct {
	IDs []int64
	At  time.Time
}

// OutboxMarkFailedParams are the inputs of OutboxExecutor.OutboxMarkFailed.
type OutboxMarkFailedParams struct {
	ID          int64
	Error       string
	NextAttempt time.Time
}

// OutboxParkParams are the inputs of OutboxExecutor.OutboxPark.
type OutboxParkParams struct {
	ID    int64
	Error string
	At    time.Time
}

// OutboxDeletePublishedBeforeParams are the inputs of
// OutboxExecutor.OutboxDeletePublishedBefore.
type OutboxDeletePublishedBeforeParams struct {
	Before time.Time
	Limit  int
	// After is the Last of the previous batch of the same sweep: only rows
	// after it in (published_at, id) order are deleted. The zero value
	// starts from the oldest row.
	After OutboxCursor
}

// RecordGetParams are the inputs of RecordExecutor.RecordGet.
type RecordGetParams struct {
	Scope string
	Key   string
}

// RecordReleaseParams are the inputs of RecordExecutor.RecordRelease.
type RecordReleaseParams struct {
	Scope      string
	Key        string
	LeaseToken string
}

// RecordExtendLeaseParams are the inputs of RecordExecutor.RecordExtendLease.
type RecordExtendLeaseParams struct {
	Scope      string
	Key        string
	LeaseToken string
	Until      time.Time
}

// RecordDeleteExpiredParams are the inputs of
// RecordExecutor.RecordDeleteExpired.
type RecordDeleteExpiredParams struct {
	Now   time.Time
	Limit int
	// After is the Last of the previous batch of the same sweep: only
	// records after it in (expires_at, scope, idempotency_key) order are
	// deleted. The zero value starts from the first.
	After RecordCursor
}

// SagaGetParams are the inputs of SagaExecutor.SagaGet.
type SagaGetParams struct {
	SagaID string
}

// SagaSetStateParams are the inputs of SagaExecutor.SagaSetState.
type SagaSetStateParams struct {
	SagaID string
	// From are the states the saga may be in for the change to happen.
	From []string
	To   string
	Now  time.Time
}

// SagaStepRecordParams are the inputs of SagaExecutor.SagaStepRecord.
type SagaStepRecordParams struct {
	SagaID string
	Step   string
	// Kind is StepForward or StepCompensation.
	Kind   string
	Result []byte
	Now    time.Time
	// Savepoint records the step inside a new savepoint of the
	// transaction (in a transaction only). When the step is inserted, the
	// savepoint stays open for the step's function, and the caller ends it
	// with SagaStepEnd; when it is not (recorded before, or refused), no
	// savepoint is left open. After an error the transaction must be
	// rolled back.
	Savepoint bool
}

// SagaStepEndParams are the inputs of SagaExecutor.SagaStepEnd.
type SagaStepEndParams struct {
	SagaID string
	Step   string
	// Result, when not nil, replaces the step's result (as
	// SagaStepSetResult) before the savepoint is released.
	Result []byte
	// Failed rolls back to the savepoint instead: the step's function
	// failed.
	Failed bool
}

// SagaStepSetResultParams are the inputs of SagaExecutor.SagaStepSetResult.
type SagaStepSetResultParams struct {
	SagaID string
	Step   string
	Result []byte
}

// SagaStepsParams are the inputs of SagaExecutor.SagaSteps.
type SagaStepsParams struct {
	SagaID string
}

// SagaListParams are the inputs of SagaExecutor.SagaList.
type SagaListParams struct {
	States []string
	Limit  int
	// AfterID, when not empty, lists only the sagas after (AfterUpdatedAt,
	// AfterID) in the list's order (updated_at, then saga_id): the next
	// page after a saga of the previous one.
	AfterID        string
	AfterUpdatedAt time.Time
}

// SagaDeleteFinishedBeforeParams are the inputs of
// SagaExecutor.SagaDeleteFinishedBefore.
type SagaDeleteFinishedBeforeParams struct {
	Before time.Time
	Limit  int
	// After is the Last of the previous batch of the same sweep: only
	// sagas after it in (finished_at, saga_id) order are deleted. The zero
	// value starts from the oldest.
	After SagaCursor
}
