package driver

import (
	"context"
	"errors"
)

// Driver gives idem access to one database. TTx is the transaction type of
// the database library (pgx.Tx, *sql.Tx).
type Driver[TTx any] interface {
	// Name identifies the backend ("postgres", "sqlite").
	Name() string

	// Executor runs statements outside any transaction (each one commits on
	// its own).
	Executor() Executor

	// Begin starts a read-write transaction.
	Begin(ctx context.Context) (TTx, error)
	// Commit commits a transaction started by Begin.
	Commit(ctx context.Context, tx TTx) error
	// Rollback rolls a transaction back. Rolling back a transaction that
	// already ended is not an error.
	Rollback(ctx context.Context, tx TTx) error

	// UnwrapExecutor returns an Executor whose statements run in tx.
	UnwrapExecutor(tx TTx) Executor

	// Migrate applies every pending migration, each in its own transaction.
	Migrate(ctx context.Context) error
	// MigrateTx applies every pending migration inside the caller's
	// transaction, so idem's tables appear atomically with the
	// application's own migration.
	MigrateTx(ctx context.Context, tx TTx) error

	// Caps tells what the backend can do.
	Caps() Caps
}

// Caps describes backend capabilities that change how idem behaves.
type Caps struct {
	// ConcurrentWriters is true when several transactions may write at
	// once (PostgreSQL); false when writers are serialised (SQLite).
	ConcurrentWriters bool
}

// Executor runs idem's statements, either in a transaction or not. Methods are
// grouped by the table they touch (Record* for idempotency records, Inbox* for processed_event,
// Outbox* for the outbox).
type Executor interface {
	RecordExecutor
	InboxExecutor
	OutboxExecutor
	LockExecutor
	SagaExecutor
}

// Errors returned by Executor methods. Drivers wrap them with %w.
var (
	// ErrNotFound: no row matched.
	ErrNotFound = errors.New("idem/driver: not found")
	// ErrLeaseLost: the caller's lease token no longer owns the record
	// (it expired and another owner took over, or the record was released).
	ErrLeaseLost = errors.New("idem/driver: lease lost")
	// ErrLockTimeout: waiting for a concurrent transaction holding the same
	// key took longer than the allowed wait.
	ErrLockTimeout = errors.New("idem/driver: lock wait timed out")
)
