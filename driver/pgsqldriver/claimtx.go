package pgsqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

var _ driver.TxClaimer[*sql.Tx] = (*Driver)(nil)

// BeginClaim implements driver.TxClaimer with pgdriver's protocol and lock
// (the key's transaction-scoped advisory lock, the same key as pgdriver's),
// in separate round trips: BEGIN, the lock (pg_try_advisory_xact_lock, or,
// with p.Wait, a lock_timeout and pg_advisory_xact_lock), then the read of
// the record, a statement of its own after the lock's, so that under READ
// COMMITTED it sees what the lock's previous holder committed.
//
// A replay takes the lock too, for a moment. When the lock is taken by
// someone else (a concurrent retry of a completed request, on any replica)
// and p.Wait is zero with p.Now set, the record is read anyway, one more
// round trip on that path only: a completed record live at p.Now is
// returned unlocked and the caller replays it, where it would otherwise
// wait for the lock (idemhttp's Config.Wait), or, with idemhttp.NoWait,
// answer 409 request-in-progress for a request that completed long ago.
func (d *Driver) BeginClaim(ctx context.Context, p *driver.TxClaimParams) (*sql.Tx, *driver.TxClaimResult, error) {
	tx, err := d.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := d.iso.Check(ctx, "pgsqldriver", func(ctx context.Context) (level string, err error) {
		return level, tx.QueryRowContext(ctx, pgsql.TxIsolationSQL).Scan(&level)
	}); err != nil {
		_ = d.Rollback(ctx, tx)
		return nil, nil, err
	}
	locked, err := d.claimLock(ctx, tx, p)
	if err == nil && locked {
		var rec *driver.Record
		rec, err = scanRecord(tx.QueryRowContext(ctx, d.expand(pgsql.ClaimReadSQL), p.Scope, p.Key))
		if errors.Is(err, sql.ErrNoRows) {
			rec, err = nil, nil
		}
		if err == nil {
			return tx, &driver.TxClaimResult{Locked: true, Record: rec}, nil
		}
	}
	if err == nil && !locked && p.Wait <= 0 && !p.Now.IsZero() {
		// Not locked: answer a completed live record without the lock
		// (a completed record does not change until it expires).
		rec, rerr := scanRecord(tx.QueryRowContext(ctx, d.expand(pgsql.ClaimReadSQL), p.Scope, p.Key))
		if rerr == nil && rec.State == driver.StateCompleted && rec.ExpiresAt.After(p.Now) {
			_ = d.Rollback(ctx, tx)
			return nil, &driver.TxClaimResult{Record: rec}, nil
		}
		if rerr != nil && !errors.Is(rerr, sql.ErrNoRows) {
			err = rerr
		}
	}
	_ = d.Rollback(ctx, tx)
	if err == nil || pgsql.SQLState(err) == pgsql.CodeLockNotAvailable {
		return nil, &driver.TxClaimResult{}, nil
	}
	return nil, nil, mapErr("begin claim", err)
}

// claimLock takes the key's advisory lock in tx, waiting at most p.Wait.
func (d *Driver) claimLock(ctx context.Context, tx *sql.Tx, p *driver.TxClaimParams) (bool, error) {
	lock := d.names.RecordLockKey(p.Scope, p.Key)
	if p.Wait <= 0 {
		var locked bool
		err := tx.QueryRowContext(ctx, pgsql.ClaimTryLockSQL, lock).Scan(&locked)
		return locked, err
	}
	// The lock_timeout is set for the wait and put back, so the handler's
	// statements keep the session's.
	for _, st := range []struct {
		sql  string
		args []any
	}{
		{pgsql.SaveLockTimeoutSQL, nil},
		{pgsql.SetLockTimeoutSQL, []any{strconv.FormatInt(max(p.Wait.Milliseconds(), 1), 10) + "ms"}},
		{pgsql.ClaimLockSQL, []any{lock}},
		{pgsql.RestoreLockTimeoutSQL, nil},
	} {
		if _, err := tx.ExecContext(ctx, st.sql, st.args...); err != nil {
			return false, err
		}
	}
	return true, nil
}

// CommitComplete implements driver.TxClaimer: the INSERT of the completed
// record (or, with p.Replace, the upsert that replaces the expired or
// abandoned one),
// then COMMIT. tx must come from BeginClaim.
func (d *Driver) CommitComplete(ctx context.Context, tx *sql.Tx, p *driver.TxCompleteParams) error {
	if tx == nil {
		return errors.New("pgsqldriver: commit complete: not an open transaction of BeginClaim")
	}
	// The INSERT and the COMMIT are bounded by ctx, not by BeginClaim's.
	done, ended := d.endOn(ctx, tx)
	defer done()
	if ended != nil {
		// BeginClaim's context ended (the client went): database/sql
		// rolls the transaction back.
		_ = tx.Rollback()
		return fmt.Errorf("pgsqldriver: commit complete: the transaction's context ended (%w): %w: %w", ended, driver.ErrTxDone, sql.ErrTxDone)
	}
	args := []any{p.Scope, p.Key, p.Fingerprint, p.Status, p.Headers, p.Body, p.CreatedAt, p.ExpiresAt}
	query := pgsql.CompleteInsertSQL
	if p.Replace {
		query = pgsql.CompleteReplaceSQL
	}
	res, err := tx.ExecContext(ctx, d.expand(query), args...)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n != 1 {
			err = fmt.Errorf("pgsqldriver: commit complete: the record came back to life: %w", driver.ErrLeaseLost)
		}
	}
	if err != nil {
		_ = tx.Rollback()
		if pgsql.SQLState(err) == pgsql.CodeUniqueViolation {
			return fmt.Errorf("pgsqldriver: commit complete: key stored by another writer: %w", driver.ErrLeaseLost)
		}
		if errors.Is(err, driver.ErrLeaseLost) {
			return err
		}
		err = mapErr("commit complete", err)
		if errors.Is(err, driver.ErrTxDone) {
			return err // the handler ended the transaction: it may have committed
		}
		// The COMMIT was not sent: nothing was committed.
		return fmt.Errorf("%w: %w", driver.ErrNotCommitted, err)
	}
	if err := tx.Commit(); err != nil {
		err = callerErr(err, nil, ctx)
		if pgsql.IsConstraintClass(err) {
			// A deferred constraint failed at COMMIT: rolled back.
			return fmt.Errorf("pgsqldriver: commit complete: %w: %w", driver.ErrTxAborted, err)
		}
		if pgsql.Refused(err) {
			return fmt.Errorf("%w: %w", driver.ErrNotCommitted, mapErr("commit complete", err))
		}
		return mapErr("commit complete", err)
	}
	return nil
}
