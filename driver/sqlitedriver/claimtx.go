package sqlitedriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/driver"
)

var _ driver.TxClaimer[*sql.Tx] = (*Driver)(nil)

// BeginClaim implements driver.TxClaimer. SQLite serialises writers: the
// write transaction (BEGIN IMMEDIATE) is the key's lock, and the record is
// read in it. The wait for the database's connection, which another
// transaction of this process may hold, and for the write lock, which
// another process may hold, is bounded by p.Wait (zero: a few
// milliseconds); when it runs out, the result is not locked. A busy timeout
// shorter than p.Wait that runs out is driver.ErrLockTimeout.
//
// End the transaction through the driver (CommitComplete, Commit, Rollback
// or RollbackEnded): that detaches it from ctx. One ended on the *sql.Tx
// itself (its Commit or Rollback) with no call of the driver after it
// stays attached: its context remains a child of ctx until ctx ends, and
// its claim mark, which holds that context, stays in the driver until
// another transaction takes its place. On a long-lived ctx (a worker's),
// that is memory kept per call: call Rollback after it, which returns nil
// on an ended transaction. (idemhttp always ends it through the driver.)
func (d *Driver) BeginClaim(ctx context.Context, p *driver.TxClaimParams) (*sql.Tx, *driver.TxClaimResult, error) {
	tx, _, err := d.beginWithin(ctx, p.Wait, true)
	if errors.Is(err, errConnWait) {
		return nil, &driver.TxClaimResult{}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	rec, err := d.UnwrapExecutor(tx).RecordGet(ctx, &driver.RecordGetParams{Scope: p.Scope, Key: p.Key})
	switch {
	case errors.Is(err, driver.ErrNotFound):
		rec = nil
	case err != nil:
		_ = d.Rollback(ctx, tx)
		return nil, nil, err
	}
	return tx, &driver.TxClaimResult{Locked: true, Record: rec}, nil
}

// minConnWait bounds the wait for the connection when no wait is allowed:
// long enough for a statement of another goroutine to finish.
const minConnWait = 25 * time.Millisecond

// errConnWait: the wait for the database's connection ran out.
var errConnWait = errors.New("sqlitedriver: the connection is held by another transaction")

// beginWithin begins a transaction like Begin (with claim, BeginClaim's,
// with a claim mark: see begin), waiting at most wait (at least
// minConnWait) for the connection; errConnWait when that ran out while ctx
// lives. database/sql rolls back a transaction whose BeginTx
// context ends, so the wait is not a context with a deadline: BeginTx runs
// on a context that ends with ctx, or when the wait runs out (leaving
// database/sql's queue; a transaction begun at that very moment is rolled
// back).
//
// That context stays attached to ctx until it is cancelled: release
// cancels it, and must run once the transaction has ended, never before
// (that would roll it back). A transaction of BeginClaim carries release
// in its claim mark, and the driver's methods that end it run it (see
// claimMark.ended); the caller of one without a claim runs it.
func (d *Driver) beginWithin(ctx context.Context, wait time.Duration, claim bool) (tx *sql.Tx, release func(), err error) {
	bctx, cancel := context.WithCancel(ctx)
	var mark *claimMark
	if claim {
		mark = &claimMark{release: cancel}
	}
	type begun struct {
		tx  *sql.Tx
		err error
	}
	ch := make(chan begun, 1)
	var began atomic.Bool // BEGIN returned: the connection and the write lock are this claim's
	go func() {
		if testHookBeginStart != nil {
			testHookBeginStart()
		}
		tx, err := d.begin(bctx, mark, func() {
			began.Store(true)
			if testHookBegan != nil {
				testHookBegan()
			}
		})
		ch <- begun{tx, err}
	}()
	wait = max(wait, minConnWait)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var b begun
wait:
	for {
		select {
		case b = <-ch:
			break wait
		case <-timer.C:
		}
		if testHookWaitRanOut != nil {
			testHookWaitRanOut(func() bool { return len(ch) > 0 })
		}
		// A Begin that finished meanwhile is kept: on a loaded machine
		// this goroutine may wake well after the timer fired, with the
		// transaction already begun.
		select {
		case b = <-ch:
			break wait
		default:
		}
		// The wait is for a connection or a write lock that another
		// holds, not for this process to run (a loaded machine stalls
		// it for seconds): giving up then would answer "in progress" for
		// a key nobody holds. Once its BEGIN returned, the connection and
		// the write lock are this claim's: the Begin ends without
		// waiting for anyone. Before, when nobody holds the connection,
		// the Begin has not taken it yet: wait again.
		if ctx.Err() == nil && began.Load() {
			b = <-ch
			break wait
		}
		if ctx.Err() == nil && d.db.Stats().InUse == 0 {
			timer.Reset(wait)
			continue
		}
		cancel()
		if b := <-ch; b.tx != nil {
			_ = d.Rollback(ctx, b.tx)
		}
		if err := ctx.Err(); err != nil {
			return nil, nil, mapErr("begin", err)
		}
		return nil, nil, errConnWait
	}
	if b.err != nil {
		cancel()
		return nil, nil, b.err
	}
	// bctx, a child of ctx, ends with it, as Begin's transaction would.
	return b.tx, cancel, nil
}

// testHookWaitRanOut, set by tests only, runs when beginWithin's wait ran
// out, before it looks whether the Begin finished (begun reports that).
var testHookWaitRanOut func(begun func() bool)

// testHookBeginStart and testHookBegan, set by tests only, run in
// beginWithin's goroutine before its Begin, and once its BEGIN returned:
// a process too slow to run it yet, or to finish it.
var testHookBeginStart, testHookBegan func()

// CommitComplete implements driver.TxClaimer: one INSERT of the completed
// record (or, with p.Replace, the upsert that replaces the expired or
// abandoned one, or stores it again if the sweep deleted it meanwhile),
// then COMMIT. On the connections of Open (and DSN) the transaction
// commits only here (see txguard.go): if the code run in it had ended it,
// nothing of it is committed, and the error wraps both driver.ErrTxDone
// and driver.ErrTxAborted.
func (d *Driver) CommitComplete(ctx context.Context, tx *sql.Tx, p *driver.TxCompleteParams) error {
	mark := takeClaim(tx)
	defer mark.ended()
	var (
		res sql.Result
		err error
	)
	args := []any{p.Scope, p.Key, p.Fingerprint, p.Status, nonNil(p.Headers), nonNil(p.Body), micros(p.CreatedAt), micros(p.ExpiresAt)}
	if p.Replace {
		// An upsert: the old record may have been deleted (by the
		// retention sweep) since it was read.
		res, err = tx.ExecContext(ctx, d.expand(`INSERT INTO {{table}}idempotency_record AS r
				(scope, idempotency_key, fingerprint, state, http_status, headers, body, created_at, expires_at)
				VALUES (?1, ?2, ?3, 'completed', ?4, ?5, ?6, ?7, ?8)
			ON CONFLICT (scope, idempotency_key) DO UPDATE SET
				fingerprint = excluded.fingerprint, state = 'completed', http_status = excluded.http_status,
				headers = excluded.headers, body = excluded.body, lease_token = NULL, lease_expires_at = NULL,
				created_at = excluded.created_at, expires_at = excluded.expires_at
			WHERE r.expires_at <= ?7 OR (r.state = 'in_progress' AND r.lease_expires_at <= ?7 AND r.fingerprint = ?3)`), args...)
	} else {
		res, err = d.inTx(tx).ExecContext(ctx, d.expand(`INSERT INTO {{table}}idempotency_record
			(scope, idempotency_key, fingerprint, state, http_status, headers, body, created_at, expires_at)
			VALUES (?1, ?2, ?3, 'completed', ?4, ?5, ?6, ?7, ?8)`), args...)
	}
	if err == nil {
		err = affected("commit complete", res)
	} else if strings.Contains(err.Error(), "UNIQUE constraint failed") {
		err = fmt.Errorf("sqlitedriver: commit complete: %w: %w", driver.ErrLeaseLost, err)
	}
	if err != nil {
		_ = tx.Rollback()
		if mark != nil && mark.guarded.Load() && errors.Is(err, sql.ErrTxDone) {
			return errClaimEnded("commit complete", mark, err)
		}
		return mapErr("commit complete", err)
	}
	if mark != nil {
		mark.complete.Store(true) // the record is written: COMMIT may proceed
	}
	if err := d.Commit(ctx, tx); err != nil {
		if isConstraint(err) {
			// A deferred constraint (a foreign key) failed at COMMIT.
			return fmt.Errorf("sqlitedriver: commit complete: %w: %w", driver.ErrTxAborted, err)
		}
		return err
	}
	return nil
}
