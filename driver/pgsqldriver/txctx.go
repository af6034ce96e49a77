package pgsqldriver

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"sync"
	"weak"
)

// database/sql sends a *sql.Tx's COMMIT and ROLLBACK on the context the
// transaction was begun with, not on one given when it ends (Tx.Commit
// takes none), and rolls the transaction back when that context ends. A
// caller that begins on a request's context and commits on another (idemhttp
// commits on context.WithoutCancel(request), bounded by CommitTimeout)
// would get a COMMIT bounded by nothing: one PostgreSQL never answers (a
// partition, a hung server) blocks until the OS gives up on the socket,
// holding the connection and the key's lock. pgdriver's Commit runs on its
// ctx.
//
// So the driver's transactions are begun on a context of their own, ended
// when the caller's ends (database/sql's rollback of a transaction whose
// context ended is kept) until Commit, Rollback or CommitComplete, which
// unlink it from the caller's and end it when their own ctx ends: the
// statement under way is given up and pgx closes the connection (the pgx
// stdlib driver has no driver.Validator: database/sql keeps the closed
// connection idle and discards it at its next use, which takes another).

// txCtx is the context a transaction of Begin or BeginClaim was begun on.
type txCtx struct {
	cancel context.CancelFunc // ends it
	unlink func() bool        // stops the caller's context from ending it
	caller context.Context    // the caller's context
}

// txContexts maps the transactions of Begin to their txCtx. The keys are
// weak: a transaction its caller ended itself (tx.Commit) is forgotten
// when it is collected.
type txContexts struct {
	mu sync.Mutex
	m  map[weak.Pointer[sql.Tx]]*txCtx
}

// begin begins a transaction on db whose context ends with ctx until
// endOn.
func (d *Driver) begin(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	if err := ctx.Err(); err != nil { // as database/sql: nothing begun
		return nil, err
	}
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	tc := &txCtx{cancel: cancel, unlink: context.AfterFunc(ctx, cancel), caller: ctx}
	tx, err := d.db.BeginTx(tctx, opts)
	if err != nil {
		tc.unlink()
		cancel()
		// Ended for ctx: ctx's own error (context.DeadlineExceeded for a
		// deadline that passed while waiting for a connection).
		return nil, callerErr(err, nil, ctx)
	}
	wp := weak.Make(tx)
	d.txs.mu.Lock()
	if d.txs.m == nil {
		d.txs.m = map[weak.Pointer[sql.Tx]]*txCtx{}
	}
	d.txs.m[wp] = tc
	d.txs.mu.Unlock()
	runtime.AddCleanup(tx, d.txs.forget, wp)
	return tx, nil
}

// forget drops the txCtx of a collected transaction.
func (c *txContexts) forget(wp weak.Pointer[sql.Tx]) {
	c.mu.Lock()
	tc := c.m[wp]
	delete(c.m, wp)
	c.mu.Unlock()
	if tc != nil {
		tc.unlink()
		tc.cancel()
	}
}

// endOn makes ctx, instead of the context tx was begun with, bound tx's end
// (its COMMIT or ROLLBACK): when ctx ends, the statement under way is
// given up. done releases it, once tx has ended. ended is the error of the
// context tx was begun with when that had already ended (nil otherwise):
// database/sql rolls tx back then (the rollback may still be under way).
func (d *Driver) endOn(ctx context.Context, tx *sql.Tx) (done func(), ended error) {
	wp := weak.Make(tx)
	d.txs.mu.Lock()
	tc := d.txs.m[wp]
	delete(d.txs.m, wp)
	d.txs.mu.Unlock()
	if tc == nil { // not begun by this driver, or ended already
		return func() {}, nil
	}
	if !tc.unlink() {
		// It ended (or is ending, on AfterFunc's goroutine): end it now,
		// so that what follows sees it ended.
		tc.cancel()
		return func() {}, tc.caller.Err()
	}
	stop := context.AfterFunc(ctx, tc.cancel)
	return func() {
		stop()
		tc.cancel()
	}, nil
}

// callerErr returns the error of the context that ended a transaction's
// (the caller's of Begin, ended, or the ctx of Commit or Rollback) for
// err, a context.Canceled of the transaction's context, as database/sql
// and pgx report a context that ended: context.DeadlineExceeded for a
// deadline. Otherwise err.
func callerErr(err, ended error, ctx context.Context) error {
	if !errors.Is(err, context.Canceled) {
		return err
	}
	if ended != nil {
		return ended
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}
