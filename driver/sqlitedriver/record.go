package sqlitedriver

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemkit/idem/driver"
)

const recordColumns = `scope, idempotency_key, fingerprint, state, http_status, headers, body,
	lease_token, lease_expires_at, created_at, expires_at`

// RecordClaim implements driver.RecordExecutor. SQLite serialises writers, so
// the INSERT ... ON CONFLICT never races. Outside a transaction, the wait
// for the database's connection (another transaction of this process may
// hold it) and for the write lock (another process) is bounded by
// LockTimeout, when set: the claim then runs in a transaction of its own,
// and a wait that runs out is driver.ErrLockTimeout, as is a busy timeout
// that runs out first.
func (e *executor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	if e.db.outsideTx() && p.LockTimeout > 0 {
		tx, release, err := e.d.beginWithin(ctx, p.LockTimeout, false)
		if errors.Is(err, errConnWait) {
			return nil, fmt.Errorf("sqlitedriver: claim: %w: %w", driver.ErrLockTimeout, err)
		}
		if err != nil {
			return nil, err
		}
		defer release() // once tx has ended
		res, err := e.d.UnwrapExecutor(tx).RecordClaim(ctx, p)
		if err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		if err := e.d.Commit(ctx, tx); err != nil {
			return nil, err
		}
		return res, nil
	}
	claimSQL := e.d.expand(`INSERT INTO {{table}}idempotency_record AS r
		(scope, idempotency_key, fingerprint, state, lease_token, lease_expires_at, created_at, expires_at)
		VALUES (?1, ?2, ?3, 'in_progress', ?4, ?5, ?6, ?7)
		ON CONFLICT (scope, idempotency_key) DO UPDATE SET
			fingerprint = excluded.fingerprint, state = 'in_progress',
			http_status = NULL, headers = NULL, body = NULL,
			lease_token = excluded.lease_token, lease_expires_at = excluded.lease_expires_at,
			created_at = excluded.created_at, expires_at = excluded.expires_at
		WHERE r.expires_at <= ?6
		   OR (r.state = 'in_progress' AND r.lease_expires_at <= ?6 AND r.fingerprint = excluded.fingerprint)
		RETURNING 1`)
	for range 5 {
		var one int
		err := e.db.QueryRowContext(ctx, claimSQL, p.Scope, p.Key, p.Fingerprint, p.LeaseToken,
			micros(p.LeaseExpiresAt), micros(p.Now), micros(p.ExpiresAt)).Scan(&one)
		if err == nil {
			return &driver.RecordClaimResult{Claimed: true}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return nil, mapErr("claim", err)
		}
		rec, err := e.RecordGet(ctx, &driver.RecordGetParams{Scope: p.Scope, Key: p.Key})
		if errors.Is(err, driver.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return &driver.RecordClaimResult{Existing: rec}, nil
	}
	return nil, errors.New("sqlitedriver: claim: the record keeps disappearing")
}

// RecordGet implements driver.RecordExecutor.
func (e *executor) RecordGet(ctx context.Context, p *driver.RecordGetParams) (*driver.Record, error) {
	scope, key := p.Scope, p.Key
	row := e.db.QueryRowContext(ctx, e.d.expand(`SELECT `+recordColumns+`
		FROM {{table}}idempotency_record WHERE scope = ? AND idempotency_key = ?`), scope, key)
	var (
		r          driver.Record
		status     sql.NullInt64
		leaseToken sql.NullString
		leaseUntil sql.NullInt64
		created    int64
		expires    int64
	)
	err := row.Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.State, &status, &r.Headers, &r.Body,
		&leaseToken, &leaseUntil, &created, &expires)
	if err != nil {
		return nil, mapErr("get record", err)
	}
	r.Status = int(status.Int64)
	r.LeaseToken = leaseToken.String
	if leaseUntil.Valid {
		r.LeaseExpiresAt = fromMicros(leaseUntil.Int64)
	}
	r.CreatedAt = fromMicros(created)
	r.ExpiresAt = fromMicros(expires)
	return &r, nil
}

// RecordComplete implements driver.RecordExecutor.
func (e *executor) RecordComplete(ctx context.Context, p *driver.RecordCompleteParams) error {
	res, err := e.db.ExecContext(ctx, e.d.expand(`UPDATE {{table}}idempotency_record
		SET state = 'completed', http_status = ?4, headers = ?5, body = ?6,
		    lease_token = NULL, lease_expires_at = NULL
		WHERE scope = ?1 AND idempotency_key = ?2 AND lease_token = ?3 AND state = 'in_progress'`),
		p.Scope, p.Key, p.LeaseToken, p.Status, nonNil(p.Headers), nonNil(p.Body))
	if err != nil {
		return mapErr("complete record", err)
	}
	return affected("complete record", res)
}

// RecordRelease implements driver.RecordExecutor.
func (e *executor) RecordRelease(ctx context.Context, p *driver.RecordReleaseParams) error {
	scope, key, token := p.Scope, p.Key, p.LeaseToken
	res, err := e.db.ExecContext(ctx, e.d.expand(`DELETE FROM {{table}}idempotency_record
		WHERE scope = ? AND idempotency_key = ? AND lease_token = ? AND state = 'in_progress'`),
		scope, key, token)
	if err != nil {
		return mapErr("release record", err)
	}
	return affected("release record", res)
}

// RecordExtendLease implements driver.RecordExecutor.
func (e *executor) RecordExtendLease(ctx context.Context, p *driver.RecordExtendLeaseParams) error {
	scope, key, token, until := p.Scope, p.Key, p.LeaseToken, p.Until
	res, err := e.db.ExecContext(ctx, e.d.expand(`UPDATE {{table}}idempotency_record SET lease_expires_at = ?4
		WHERE scope = ?1 AND idempotency_key = ?2 AND lease_token = ?3 AND state = 'in_progress'`),
		scope, key, token, micros(until))
	if err != nil {
		return mapErr("extend lease", err)
	}
	return affected("extend lease", res)
}

// RecordDeleteExpired implements driver.RecordExecutor: the records after
// p.After in the order of the expires_at index (expires_at, then the
// primary key).
func (e *executor) RecordDeleteExpired(ctx context.Context, p *driver.RecordDeleteExpiredParams) (driver.DeleteResult[driver.RecordCursor], error) {
	if p.Limit <= 0 {
		return driver.DeleteResult[driver.RecordCursor]{Last: p.After}, fmt.Errorf("sqlitedriver: delete expired records: limit %d must be positive", p.Limit)
	}
	resume := !p.After.IsZero()
	args := []any{micros(p.Now), p.Limit}
	if resume {
		args = append(args, micros(p.After.ExpiresAt), p.After.Scope, p.After.Key)
	}
	query := keysetSQL(`DELETE FROM {{table}}idempotency_record
		WHERE (scope, idempotency_key) IN (
			SELECT scope, idempotency_key FROM {{table}}idempotency_record
			WHERE expires_at <= ?1`, `(expires_at, scope, idempotency_key) > (?3, ?4, ?5)`, `
			ORDER BY expires_at, scope, idempotency_key LIMIT ?2)
		RETURNING expires_at, scope, idempotency_key`, resume)
	n, last, err := retentionDelete(ctx, e, "delete expired records", query, args, p.After,
		func(r scanner) (driver.RecordCursor, error) {
			var c driver.RecordCursor
			var at int64
			err := r.Scan(&at, &c.Scope, &c.Key)
			c.ExpiresAt = fromMicros(at)
			return c, err
		},
		func(a, b driver.RecordCursor) bool {
			return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Key, b.Key)) < 0
		})
	return driver.DeleteResult[driver.RecordCursor]{Deleted: n, Last: last}, err
}

// nonNil keeps an empty body distinct from "no body" (NULL).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
