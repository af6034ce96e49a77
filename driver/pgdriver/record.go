package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
)

const recordColumns = `scope, idempotency_key, fingerprint, state, http_status, headers, body,
	lease_token, lease_expires_at, created_at, expires_at`

// RecordClaim implements driver.RecordExecutor. The INSERT ... ON CONFLICT
// waits on the unique index for a concurrent uncommitted claim of the same
// key; p.LockTimeout bounds that wait with a transaction-local lock_timeout.
func (e *executor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	claimSQL := e.d.expand(`INSERT INTO {{table}}idempotency_record AS r
		(scope, idempotency_key, fingerprint, state, lease_token, lease_expires_at, created_at, expires_at)
		VALUES ($1, $2, $3, 'in_progress', $4, $5, $6, $7)
		ON CONFLICT (scope, idempotency_key) DO UPDATE SET
			fingerprint = EXCLUDED.fingerprint, state = 'in_progress',
			http_status = NULL, headers = NULL, body = NULL,
			lease_token = EXCLUDED.lease_token, lease_expires_at = EXCLUDED.lease_expires_at,
			created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
		WHERE r.expires_at <= $6
		   OR (r.state = 'in_progress' AND r.lease_expires_at <= $6 AND r.fingerprint = EXCLUDED.fingerprint)
		RETURNING true`)
	args := []any{p.Scope, p.Key, p.Fingerprint, p.LeaseToken, p.LeaseExpiresAt, p.Now, p.ExpiresAt}

	// A deleted record between the claim and the read (released by its
	// owner) makes us try again; a few rounds always settle it.
	for range 5 {
		claimed, err := e.claimOnce(ctx, claimSQL, args, p.LockTimeout)
		if err != nil {
			return nil, err
		}
		if claimed {
			return &driver.RecordClaimResult{Claimed: true}, nil
		}
		rec, err := e.RecordGet(ctx, p.Scope, p.Key)
		if errors.Is(err, driver.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return &driver.RecordClaimResult{Existing: rec}, nil
	}
	return nil, fmt.Errorf("pgdriver: claim %q: record keeps disappearing", p.Key)
}

// claimOnce runs the claim statement, with the lock timeout set around it in
// the same round trip. Outside a transaction the batch runs in the implicit
// transaction of one pipeline sync, so the local setting still applies and
// ends with it. In the caller's transaction the caller's own lock_timeout is
// saved first and restored after the claim.
func (e *executor) claimOnce(ctx context.Context, claimSQL string, args []any, lockTimeout time.Duration) (bool, error) {
	if lockTimeout <= 0 {
		var ok bool
		err := e.db.QueryRow(ctx, claimSQL, args...).Scan(&ok)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return ok, mapErr("claim", err)
	}
	b := &pgx.Batch{}
	if e.inTx {
		b.Queue("SELECT set_config('idem.saved_lock_timeout', current_setting('lock_timeout'), true)")
	}
	b.Queue("SELECT set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", max(lockTimeout.Milliseconds(), 1)))
	var ok bool
	b.Queue(claimSQL, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&ok)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if e.inTx {
		b.Queue("SELECT set_config('lock_timeout', current_setting('idem.saved_lock_timeout'), true)")
	}
	err := e.db.SendBatch(ctx, b).Close()
	return ok, mapErr("claim", err)
}

// RecordGet implements driver.RecordExecutor.
func (e *executor) RecordGet(ctx context.Context, scope, key string) (*driver.Record, error) {
	row := e.db.QueryRow(ctx, e.d.expand(`SELECT `+recordColumns+`
		FROM {{table}}idempotency_record WHERE scope = $1 AND idempotency_key = $2`), scope, key)
	var (
		r          driver.Record
		status     *int32
		leaseToken *string
		leaseUntil *time.Time
	)
	err := row.Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.State, &status, &r.Headers, &r.Body,
		&leaseToken, &leaseUntil, &r.CreatedAt, &r.ExpiresAt)
	if err != nil {
		return nil, mapErr("get record", err)
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
	tag, err := e.db.Exec(ctx, e.d.expand(`UPDATE {{table}}idempotency_record
		SET state = 'completed', http_status = $4, headers = $5, body = $6,
		    lease_token = NULL, lease_expires_at = NULL
		WHERE scope = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'`),
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
func (e *executor) RecordRelease(ctx context.Context, scope, key, token string) error {
	tag, err := e.db.Exec(ctx, e.d.expand(`DELETE FROM {{table}}idempotency_record
		WHERE scope = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'`),
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
func (e *executor) RecordExtendLease(ctx context.Context, scope, key, token string, until time.Time) error {
	tag, err := e.db.Exec(ctx, e.d.expand(`UPDATE {{table}}idempotency_record SET lease_expires_at = $4
		WHERE scope = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'`),
		scope, key, token, until)
	if err != nil {
		return mapErr("extend lease", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: extend lease: %w", driver.ErrLeaseLost)
	}
	return nil
}

// RecordDeleteExpired implements driver.RecordExecutor. It deletes by ctid in
// a bounded subquery so one statement never locks more than limit rows.
func (e *executor) RecordDeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	tag, err := e.db.Exec(ctx, e.d.expand(`DELETE FROM {{table}}idempotency_record WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {{table}}idempotency_record WHERE expires_at <= $1 LIMIT $2
		FOR UPDATE SKIP LOCKED))`), now, limit)
	if err != nil {
		return 0, mapErr("delete expired records", err)
	}
	return int(tag.RowsAffected()), nil
}
