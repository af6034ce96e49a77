package pgsqldriver

import (
	"context"
	"database/sql"
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
// statement under way is given up (pgx closes the connection) and the
// connection is never put back in the pool.

// txCtx is the context a transaction of Begin or BeginClaim was begun on.
type txCtx struct {
	cancel context.CancelFunc // ends it
	unlink func() bool        // stops the caller's context from ending it
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
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	tc := &txCtx{cancel: cancel, unlink: context.AfterFunc(ctx, cancel)}
	tx, err := d.db.BeginTx(tctx, opts)
	if err != nil {
		tc.unlink()
		cancel()
		return nil, err
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
// given up. done releases it, once tx has ended. live is false when the
// context tx was begun with had already ended: database/sql rolls tx back
// (now ended, the rollback may still be under way).
func (d *Driver) endOn(ctx context.Context, tx *sql.Tx) (done func(), live bool) {
	wp := weak.Make(tx)
	d.txs.mu.Lock()
	tc := d.txs.m[wp]
	delete(d.txs.m, wp)
	d.txs.mu.Unlock()
	if tc == nil { // not begun by this driver, or ended already
		return func() {}, true
	}
	if !tc.unlink() {
		// It ended (or is ending, on AfterFunc's goroutine): end it now,
		// so that what follows sees it ended.
		tc.cancel()
		return func() {}, false
	}
	stop := context.AfterFunc(ctx, tc.cancel)
	return func() {
		stop()
		tc.cancel()
	}, true
}
