package pgsqldriver

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// scanner is *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// RecordClaim implements driver.RecordExecutor with pgdriver's statements
// (see pgsql.ClaimInsertSQL), sent one after the other: the claim, the read
// of the record, and, only to take over an expired or abandoned record, an
// UPDATE. p.LockTimeout bounds the wait for a concurrent claim with a
// transaction-local lock_timeout (see withLockTimeout).
func (e *executor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	args := []any{p.Scope, p.Key, p.Fingerprint, p.LeaseToken, p.LeaseExpiresAt, p.Now, p.ExpiresAt}
	// A record deleted between the insert and the read (released by its
	// owner), or taken over by someone else, makes us try again; a few
	// rounds always settle it.
	for range 5 {
		var (
			claimed bool
			rec     *driver.Record
		)
		err := e.withLockTimeout(ctx, p.LockTimeout, func(q dbtx) error {
			err := q.QueryRowContext(ctx, e.d.expand(pgsql.ClaimInsertSQL), args...).Scan(&claimed)
			if err == nil || !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			rec, err = scanRecord(q.QueryRowContext(ctx, e.d.expand(pgsql.ClaimReadSQL), p.Scope, p.Key))
			if errors.Is(err, sql.ErrNoRows) {
				return nil
			}
			return err
		})
		if err != nil {
			return nil, mapErr("claim", err)
		}
		if claimed {
			return &driver.RecordClaimResult{Claimed: true}, nil
		}
		if rec == nil {
			continue
		}
		abandoned := rec.State == driver.StateInProgress && !rec.LeaseExpiresAt.After(p.Now) &&
			bytes.Equal(rec.Fingerprint, p.Fingerprint)
		if rec.ExpiresAt.After(p.Now) && !abandoned {
			return &driver.RecordClaimResult{Existing: rec}, nil
		}
		// The take-over waits on the row lock of a concurrent taker (in
		// ModeTx, for as long as its handler runs): bound it like the claim.
		var took int64
		err = e.withLockTimeout(ctx, p.LockTimeout, func(q dbtx) error {
			res, err := q.ExecContext(ctx, e.d.expand(pgsql.ClaimTakeOverSQL), args...)
			if err != nil {
				return err
			}
			took, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return nil, mapErr("claim: take over", err)
		}
		if took == 1 {
			return &driver.RecordClaimResult{Claimed: true}, nil
		}
	}
	return nil, errors.New("pgsqldriver: claim: the record keeps changing (tried 5 times)")
}

// withLockTimeout runs fn with lock_timeout set to lockTimeout (fn runs on
// e.db when it is zero). Outside a transaction fn runs in a transaction of
// its own, so the local setting ends with it. In the caller's transaction
// the caller's own lock_timeout is saved first and restored afterwards.
func (e *executor) withLockTimeout(ctx context.Context, lockTimeout time.Duration, fn func(q dbtx) error) error {
	if lockTimeout <= 0 {
		return fn(e.db)
	}
	setting := fmt.Sprintf("%dms", max(lockTimeout.Milliseconds(), 1))
	if !e.inTx {
		tx, err := e.d.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, pgsql.SetLockTimeoutSQL, setting); err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Commit()
	}
	if _, err := e.db.ExecContext(ctx, pgsql.SaveLockTimeoutSQL); err != nil {
		return err
	}
	if _, err := e.db.ExecContext(ctx, pgsql.SetLockTimeoutSQL, setting); err != nil {
		return err
	}
	if err := fn(e.db); err != nil {
		return err
	}
	_, err := e.db.ExecContext(ctx, pgsql.RestoreLockTimeoutSQL)
	return err
}

// RecordGet implements driver.RecordExecutor.
func (e *executor) RecordGet(ctx context.Context, p *driver.RecordGetParams) (*driver.Record, error) {
	r, err := scanRecord(e.db.QueryRowContext(ctx, e.d.expand(pgsql.ClaimReadSQL), p.Scope, p.Key))
	if err != nil {
		return nil, mapErr("get record", err)
	}
	return r, nil
}

func scanRecord(row scanner) (*driver.Record, error) {
	var (
		r          driver.Record
		status     sql.NullInt32
		leaseToken sql.NullString
		leaseUntil sql.NullTime
	)
	err := row.Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.State, &status, &r.Headers, &r.Body,
		&leaseToken, &leaseUntil, &r.CreatedAt, &r.ExpiresAt)
	if err != nil {
		return nil, err
	}
	r.Status = int(status.Int32)
	r.LeaseToken = leaseToken.String
	r.LeaseExpiresAt = nullTime(leaseUntil)
	return &r, nil
}

// execOwned runs a statement that must change the caller's row, or fails
// with ErrLeaseLost.
func (e *executor) execOwned(ctx context.Context, op, query string, args ...any) error {
	res, err := e.db.ExecContext(ctx, e.d.expand(query), args...)
	n, err := rowsAffected(op, res, err)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("pgsqldriver: %s: %w", op, driver.ErrLeaseLost)
	}
	return nil
}

// RecordComplete implements driver.RecordExecutor.
func (e *executor) RecordComplete(ctx context.Context, p *driver.RecordCompleteParams) error {
	return e.execOwned(ctx, "complete record", pgsql.RecordCompleteSQL,
		p.Scope, p.Key, p.LeaseToken, p.Status, p.Headers, p.Body)
}

// RecordRelease implements driver.RecordExecutor.
func (e *executor) RecordRelease(ctx context.Context, p *driver.RecordReleaseParams) error {
	return e.execOwned(ctx, "release record", pgsql.RecordReleaseSQL, p.Scope, p.Key, p.LeaseToken)
}

// RecordExtendLease implements driver.RecordExecutor.
func (e *executor) RecordExtendLease(ctx context.Context, p *driver.RecordExtendLeaseParams) error {
	return e.execOwned(ctx, "extend lease", pgsql.RecordExtendLeaseSQL, p.Scope, p.Key, p.LeaseToken, p.Until)
}

// RecordDeleteExpired implements driver.RecordExecutor (see
// pgsql.RecordDeleteExpiredSQL).
func (e *executor) RecordDeleteExpired(ctx context.Context, p *driver.RecordDeleteExpiredParams) (driver.DeleteResult[driver.RecordCursor], error) {
	res := driver.DeleteResult[driver.RecordCursor]{Last: p.After}
	if p.Limit <= 0 {
		return res, fmt.Errorf("pgsqldriver: delete expired records: limit %d must be positive", p.Limit)
	}
	args := []any{p.Now, p.Limit}
	if !p.After.IsZero() {
		args = append(args, p.After.ExpiresAt, p.After.Scope, p.After.Key)
	}
	var last driver.RecordCursor
	n, err := e.retentionDelete(ctx, "delete expired records", pgsql.RecordDeleteExpiredSQL.Pick(!p.After.IsZero()), args,
		&last.ExpiresAt, &last.Scope, &last.Key)
	if err != nil || n == 0 {
		return res, err
	}
	return driver.DeleteResult[driver.RecordCursor]{Deleted: n, Last: last}, nil
}

// retentionDelete runs one batch of a retention delete (a variant of one
// of pgsql's RetentionSQL, not expanded) and reads its row: it returns how
// many rows it deleted, and scans the last one's key into last; 0 when it
// deleted none.
func (e *executor) retentionDelete(ctx context.Context, op, query string, args []any, last ...any) (int, error) {
	var n int
	err := e.db.QueryRowContext(ctx, e.d.expand(query), args...).Scan(append([]any{&n}, last...)...)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, mapErr(op, err)
	}
	return n, nil
}

// LockAcquire implements driver.LockExecutor (see pgsql.LockAcquireSQL).
func (e *executor) LockAcquire(ctx context.Context, p *driver.LockAcquireParams) (bool, error) {
	var ok bool
	err := e.db.QueryRowContext(ctx, e.d.expand(pgsql.LockAcquireSQL), p.Name, p.Owner, p.Now, p.Until).Scan(&ok)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, mapErr("lock acquire", err)
	}
	return ok, nil
}

// LockRenew implements driver.LockExecutor.
func (e *executor) LockRenew(ctx context.Context, p *driver.LockRenewParams) error {
	return e.execOwned(ctx, "lock renew "+p.Name, pgsql.LockRenewSQL, p.Name, p.Owner, p.Until)
}

// LockRelease implements driver.LockExecutor.
func (e *executor) LockRelease(ctx context.Context, p *driver.LockReleaseParams) error {
	return e.execOwned(ctx, "lock release "+p.Name, pgsql.LockReleaseSQL, p.Name, p.Owner)
}

// LockGet implements driver.LockExecutor.
func (e *executor) LockGet(ctx context.Context, p *driver.LockGetParams) (string, time.Time, error) {
	var (
		owner   string
		expires time.Time
	)
	err := e.db.QueryRowContext(ctx, e.d.expand(pgsql.LockGetSQL), p.Name).Scan(&owner, &expires)
	if err != nil {
		return "", time.Time{}, mapErr("lock get", err)
	}
	return owner, expires, nil
}
