package pgdriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// SQL of the claim. The INSERT ... ON CONFLICT DO NOTHING waits on the
// unique index for a concurrent uncommitted claim of the same key, then
// either inserts (the other rolled back) or does nothing. Doing nothing takes
// no row lock and writes no WAL, so replays stay cheap; the read that follows
// in the same round trip runs with a fresh snapshot (READ COMMITTED) and sees
// the row the other transaction committed.
const (
	claimInsertSQL = pgsql.ClaimInsertSQL
	claimReadSQL   = pgsql.ClaimReadSQL
	// claimTakeOverSQL replaces an expired record, or an abandoned
	// in-progress one with the same fingerprint. A concurrent taker blocks on
	// the row lock and then re-checks the condition, so only one wins.
	claimTakeOverSQL = pgsql.ClaimTakeOverSQL
)

// RecordClaim implements driver.RecordExecutor: one round trip for a new key
// or a replay; a second one only to take over an expired or abandoned record.
// p.LockTimeout bounds the wait for a concurrent claim with a
// transaction-local lock_timeout.
func (e *executor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	args := []any{p.Scope, p.Key, p.Fingerprint, p.LeaseToken, p.LeaseExpiresAt, p.Now, p.ExpiresAt}
	// A record deleted between the insert and the read (released by its
	// owner), or taken over by someone else, makes us try again; a few
	// rounds always settle it.
	for range 5 {
		claimed, rec, err := e.claimOnce(ctx, args, p.LockTimeout)
		if err != nil {
			return nil, err
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
		b := &pgx.Batch{}
		b.Queue(e.d.expand(claimTakeOverSQL), args...).Exec(func(tag pgconn.CommandTag) error {
			took = tag.RowsAffected()
			return nil
		})
		if err := e.sendWithLockTimeout(ctx, b, p.LockTimeout); err != nil {
			return nil, mapErr("claim: take over", err)
		}
		if took == 1 {
			return &driver.RecordClaimResult{Claimed: true}, nil
		}
	}
	return nil, errors.New("pgdriver: claim: the record keeps changing (tried 5 times)")
}

// claimOnce sends the claim and the read in one batch, with the lock timeout
// set around them. Outside a transaction the batch runs in the implicit
// transaction of one pipeline sync, so the local setting ends with it. In the
// caller's transaction the caller's own lock_timeout is saved first and
// restored after the claim.
func (e *executor) claimOnce(ctx context.Context, args []any, lockTimeout time.Duration) (claimed bool, rec *driver.Record, err error) {
	b := &pgx.Batch{}
	b.Queue(e.d.expand(claimInsertSQL), args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&claimed)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	b.Queue(e.d.expand(claimReadSQL), args[0], args[1]).QueryRow(func(row pgx.Row) error {
		r, err := scanRecord(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		rec = r
		return err
	})
	if err := e.sendWithLockTimeout(ctx, b, lockTimeout); err != nil {
		return false, nil, mapErr("claim", err)
	}
	return claimed, rec, nil
}

// sendWithLockTimeout sends the statements of b with lock_timeout set to
// lockTimeout around them (nothing when it is zero). Outside a transaction
// the batch runs in the implicit transaction of one pipeline sync, so the
// local setting ends with it. In the caller's transaction the caller's own
// lock_timeout is saved first and restored afterwards.
func (e *executor) sendWithLockTimeout(ctx context.Context, b *pgx.Batch, lockTimeout time.Duration) error {
	if lockTimeout > 0 {
		var pre []*pgx.QueuedQuery
		if e.inTx {
			pre = append(pre, &pgx.QueuedQuery{SQL: pgsql.SaveLockTimeoutSQL})
		}
		pre = append(pre, &pgx.QueuedQuery{SQL: pgsql.SetLockTimeoutSQL,
			Arguments: []any{fmt.Sprintf("%dms", max(lockTimeout.Milliseconds(), 1))}})
		b.QueuedQueries = append(pre, b.QueuedQueries...)
		if e.inTx {
			b.Queue(pgsql.RestoreLockTimeoutSQL)
		}
	}
	return e.db.SendBatch(ctx, b).Close()
}

// RecordGet implements driver.RecordExecutor.
func (e *executor) RecordGet(ctx context.Context, p *driver.RecordGetParams) (*driver.Record, error) {
	scope, key := p.Scope, p.Key
	r, err := scanRecord(e.db.QueryRow(ctx, e.d.expand(claimReadSQL), scope, key))
	if err != nil {
		return nil, mapErr("get record", err)
	}
	return r, nil
}

func scanRecord(row pgx.Row) (*driver.Record, error) {
	var (
		r          driver.Record
		status     *int32
		leaseToken *string
		leaseUntil *time.Time
	)
	err := row.Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.State, &status, &r.Headers, &r.Body,
		&leaseToken, &leaseUntil, &r.CreatedAt, &r.ExpiresAt)
	if err != nil {
		return nil, err
	}
	if status != nil {
		r.Status = int(*status)
	}
	if leaseToken != nil {
		r.LeaseToken = *leaseToken
	}
	if leaseUntil != nil {
		r.LeaseExpiresAt = *leaseUntil
	}
	return &r, nil
}

// RecordComplete implements driver.RecordExecutor.
func (e *executor) RecordComplete(ctx context.Context, p *driver.RecordCompleteParams) error {
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.RecordCompleteSQL),
		p.Scope, p.Key, p.LeaseToken, p.Status, p.Headers, p.Body)
	if err != nil {
		return mapErr("complete record", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: complete record: %w", driver.ErrLeaseLost)
	}
	return nil
}

// RecordRelease implements driver.RecordExecutor.
func (e *executor) RecordRelease(ctx context.Context, p *driver.RecordReleaseParams) error {
	scope, key, token := p.Scope, p.Key, p.LeaseToken
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.RecordReleaseSQL),
		scope, key, token)
	if err != nil {
		return mapErr("release record", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: release record: %w", driver.ErrLeaseLost)
	}
	return nil
}

// RecordExtendLease implements driver.RecordExecutor.
func (e *executor) RecordExtendLease(ctx context.Context, p *driver.RecordExtendLeaseParams) error {
	scope, key, token, until := p.Scope, p.Key, p.LeaseToken, p.Until
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.RecordExtendLeaseSQL),
		scope, key, token, until)
	if err != nil {
		return mapErr("extend lease", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: extend lease: %w", driver.ErrLeaseLost)
	}
	return nil
}

// RecordDeleteExpired implements driver.RecordExecutor. It deletes the
// records after p.After by ctid from bounded subqueries (see
// pgsql.RecordDeleteExpiredSQL), skipping records a concurrent transaction
// holds.
func (e *executor) RecordDeleteExpired(ctx context.Context, p *driver.RecordDeleteExpiredParams) (driver.DeleteResult[driver.RecordCursor], error) {
	res := driver.DeleteResult[driver.RecordCursor]{Last: p.After}
	if p.Limit <= 0 {
		return res, fmt.Errorf("pgdriver: delete expired records: limit %d must be positive", p.Limit)
	}
	args := []any{p.Now, p.Limit}
	if !p.After.IsZero() {
		args = append(args, p.After.ExpiresAt, p.After.Scope, p.After.Key)
	}
	var last driver.RecordCursor
	var n int
	err := e.db.QueryRow(ctx, e.d.expand(pgsql.RecordDeleteExpiredSQL.Pick(!p.After.IsZero())), args...).
		Scan(&n, &last.ExpiresAt, &last.Scope, &last.Key)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, nil
	}
	if err != nil {
		return res, mapErr("delete expired records", err)
	}
	return driver.DeleteResult[driver.RecordCursor]{Deleted: n, Last: last}, nil
}
