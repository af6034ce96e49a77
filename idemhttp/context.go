package idemhttp

import "context"

type txKey struct{}

type keyKey struct{}

// TxFromContext returns the transaction a ModeTx middleware opened for the
// request. The handler does its business writes through it; the middleware
// commits it together with the stored response. The handler must not commit
// or roll it back itself: answering with a status that is not stored (5xx by
// default) rolls it back. With pgdriver the transaction's Commit and
// Rollback return an error and do nothing (its savepoints, tx.Begin, work).
// With a *sql.Tx a handler that ended it gets 500 transaction-ended, its
// outcome not stored, also when it answered a failure that is not stored
// (a 5xx, a response too large): passed on, a retryable failure would be
// retried. With sqlitedriver (a database of Open or DSN) its
// Commit fails and rolls the transaction back: nothing was committed, and
// a retry executes once. With pgsqldriver (and the generic path of other
// drivers) its Commit commits the handler's writes without the record: a
// retry executes the command again, a double effect. A statement that may
// fail belongs in a savepoint (uniq.SavepointTx with a pgx.Tx,
// uniq.SavepointSQLTx with a *sql.Tx; uniq.CreateOrGetTx and
// uniq.CreateOrGetSQLTx for a create-or-get): on PostgreSQL a failed
// statement aborts the whole transaction, and the request answers 500
// transaction-aborted.
//
// The transaction lives as long as the handler runs: the middleware commits
// it once the handler has returned. Work the handler leaves running (a 202
// answered, the rest in a goroutine) must not use it: after the COMMIT it
// fails (pgx: "tx is closed"), and during it the two share one connection,
// which neither pgx.Tx nor *sql.Tx allows (pgx's connection then panics or
// hangs, and is not given back to the pool). Such work opens a transaction
// of its own, or is handed over through the outbox.
//
// ok is false outside a ModeTx middleware, or when TTx is not the driver's
// transaction type (pgx.Tx for pgdriver, *sql.Tx for pgsqldriver and
// sqlitedriver).
func TxFromContext[TTx any](ctx context.Context) (TTx, bool) {
	tx, ok := ctx.Value(txKey{}).(TTx)
	return tx, ok
}

// KeyFromContext returns the Idempotency-Key of the request being executed,
// for handlers that pass it on to a downstream system.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyKey{}).(string)
	return k, ok
}
