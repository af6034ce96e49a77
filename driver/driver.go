package driver

import (
	"context"
	"errors"
	"fmt"
)

// Backend is what every idem component needs of a database: its name, its
// capabilities and transactions. TTx is the transaction type of the database
// library (pgx.Tx, *sql.Tx).
type Backend[TTx any] interface {
	// Name identifies the backend ("postgres", "sqlite").
	Name() string
	// Caps tells what the backend can do.
	Caps() Caps

	// Begin starts a read-write transaction.
	Begin(ctx context.Context) (TTx, error)
	// Commit commits a transaction started by Begin.
	Commit(ctx context.Context, tx TTx) error
	// Rollback rolls a transaction back. Rolling back a transaction that
	// already ended is not an error.
	Rollback(ctx context.Context, tx TTx) error
}

// EndedRollbacker is implemented by backends that can tell, as they roll a
// transaction back, that it had already ended: the code run in it
// committed or rolled it back itself (idemhttp's handler, which must not).
// Backend.Rollback cannot say so, since rolling back an ended transaction
// is not an error there. idemhttp uses it when it rolls back a transaction
// whose handler answered a failure, so that it does not pass that answer on
// (a client would retry it and execute again an effect the handler
// committed).
type EndedRollbacker[TTx any] interface {
	// RollbackEnded rolls tx back as Backend.Rollback does, with no
	// statement more, and returns an error wrapping ErrTxDone when tx had
	// already been committed or rolled back; also ErrTxAborted when
	// nothing of it was committed (sqlitedriver: a transaction of
	// BeginClaim). database/sql also ends a transaction when the context
	// it was begun with ends: the caller tells that apart by the context.
	// Any other error is Rollback's.
	RollbackEnded(ctx context.Context, tx TTx) error
}

// The stores give the executor of one group of tables, outside any
// transaction (each statement commits on its own) or in the caller's
// transaction (the ...Tx methods, which never commit it).
type (
	// RecordStore gives the executor of idempotency records.
	RecordStore[TTx any] interface {
		Records() RecordExecutor
		RecordsTx(tx TTx) RecordExecutor
	}
	// InboxStore gives the executor of the consumer inbox.
	InboxStore[TTx any] interface {
		Inbox() InboxExecutor
		InboxTx(tx TTx) InboxExecutor
	}
	// OutboxStore gives the executor of the transactional outbox.
	OutboxStore[TTx any] interface {
		Outbox() OutboxExecutor
		OutboxTx(tx TTx) OutboxExecutor
	}
	// SagaStore gives the executor of sagas and their steps.
	SagaStore[TTx any] interface {
		Sagas() SagaExecutor
		SagasTx(tx TTx) SagaExecutor
	}
	// LockStore gives the executor of named leases.
	LockStore interface {
		Locks() LockExecutor
	}
)

// What each component takes: a backend that serves only the middleware
// implements RecordDriver, and so on. A full Driver is all of them.
type (
	// RecordDriver is what idemhttp needs.
	RecordDriver[TTx any] interface {
		Backend[TTx]
		RecordStore[TTx]
	}
	// InboxDriver is what inbox needs.
	InboxDriver[TTx any] interface {
		Backend[TTx]
		InboxStore[TTx]
	}
	// OutboxDriver is what outbox needs (the relay, EnqueueTx, Redrive).
	OutboxDriver[TTx any] interface {
		Backend[TTx]
		OutboxStore[TTx]
	}
	// SagaDriver is what saga needs: its own tables and the outbox, for
	// the events a step emits.
	SagaDriver[TTx any] interface {
		Backend[TTx]
		SagaStore[TTx]
		OutboxStore[TTx]
	}
)

// Driver gives idem access to every table of one database: what the cleaner
// and the reference daemon take. pgdriver, pgsqldriver and sqlitedriver
// implement it.
type Driver[TTx any] interface {
	Backend[TTx]
	RecordStore[TTx]
	InboxStore[TTx]
	OutboxStore[TTx]
	SagaStore[TTx]
	LockStore

	// Executor runs statements of every table outside any transaction
	// (each one commits on its own).
	Executor() Executor
	// UnwrapExecutor returns an Executor whose statements run in tx.
	UnwrapExecutor(tx TTx) Executor

	// Migrate applies every pending migration, each in its own transaction.
	Migrate(ctx context.Context) error
	// MigrateTx applies every pending migration inside the caller's
	// transaction, so idem's tables appear atomically with the
	// application's own migration.
	MigrateTx(ctx context.Context, tx TTx) error
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
	// ErrTxAborted: the transaction could not commit because a statement
	// in it failed (PostgreSQL aborts the transaction: SQLSTATE 25P02, and
	// Backend.Commit of pgdriver and pgsqldriver returns it, wrapping pgx's
	// ErrTxCommitRollback, when PostgreSQL answered the COMMIT with
	// ROLLBACK), or a deferred constraint failed at COMMIT. Nothing of it
	// was committed, and running the same statements again fails the same
	// way.
	ErrTxAborted = errors.New("idem/driver: transaction aborted by a failed statement")
	// ErrTxDone: the transaction had already been committed or rolled back
	// (by the code that ran in it) when the driver was to complete it. The
	// record was not stored; what the transaction did before it ended may
	// have been committed, unless the error is also ErrTxAborted: then
	// nothing of it was (sqlitedriver turns a COMMIT of BeginClaim's
	// transaction without the record into a rollback).
	ErrTxDone = errors.New("idem/driver: transaction already committed or rolled back")
	// ErrNotCommitted: the transaction ended without committing anything
	// of it, and the driver knows it: the database answered the completed
	// record's write, or the COMMIT itself, with an error (PostgreSQL
	// rolls the transaction back: a COMMIT pipelined after a failed
	// statement does not run), or the record's write failed and the COMMIT
	// was never sent. A failure of the COMMIT's round trip itself (the
	// connection lost, no answer, the context ended) is not one: the
	// server may have committed. The driver wraps the database's error,
	// which tells whether the failure passes (dberr.Transient) or needs an
	// operator (dberr.Misconfigured). idemhttp answers store-unavailable
	// for it, not outcome-unknown.
	ErrNotCommitted = errors.New("idem/driver: the database refused the transaction's record or COMMIT; nothing was committed")
	// ErrNotMigrated: one of idem's tables, or the schema they live in,
	// does not exist (PostgreSQL's SQLSTATE 42P01 undefined_table or
	// 3F000 invalid_schema_name, SQLite's "no such table"): the driver's
	// Migrate (or idemd migrate up) has not run on this database, or the
	// driver's Schema or TablePrefix is not the one migrated. The driver
	// wraps the database's error, which names the table. Not transient:
	// retrying fails the same way until an operator migrates (idemhttp
	// answers 500 store-unavailable, without Retry-After).
	ErrNotMigrated = errors.New("idem/driver: idem's tables are missing: run the driver's Migrate (or idemd migrate up) on this database, with the schema and table prefix the driver is configured with")
	// ErrOutboxNotifyOff: the driver was configured not to notify on
	// outbox inserts (pgdriver.Config.NoOutboxNotify), so its ListenOutbox
	// has nothing to listen for. It wraps errors.ErrUnsupported: a relay
	// polls for good, and says so at INFO (a choice, not a fault).
	ErrOutboxNotifyOff = fmt.Errorf("idem/driver: outbox inserts do not NOTIFY (NoOutboxNotify is set): relays poll: %w", errors.ErrUnsupported)
)
