package sqlitedriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/driver"
)

var _ driver.TxClaimer[*sql.Tx] = (*Driver)(nil)

// BeginClaim implements driver.TxClaimer. SQLite serialises writers: the
// write transaction (BEGIN IMMEDIATE, waiting as Begin does) is the key's
// lock, so Locked is always true, and the record is read in it.
func (d *Driver) BeginClaim(ctx context.Context, p *driver.TxClaimParams) (*sql.Tx, *driver.TxClaimResult, error) {
	tx, err := d.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	rec, err := d.UnwrapExecutor(tx).RecordGet(ctx, &driver.RecordGetParams{Scope: p.Scope, Key: p.Key})
	switch {
	case errors.Is(err, driver.ErrNotFound):
		rec = nil
	case err != nil:
		_ = tx.Rollback()
		return nil, nil, err
	}
	return tx, &driver.TxClaimResult{Locked: true, Record: rec}, nil
}

// CommitComplete implements driver.TxClaimer: one INSERT of the completed
// record (or, with p.Replace, the upsert that replaces the expired or
// abandoned one, or stores it again if the sweep deleted it meanwhile),
// then COMMIT.
func (d *Driver) CommitComplete(ctx context.Context, tx *sql.Tx, p *driver.TxCompleteParams) error {
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
		return mapErr("commit complete", err)
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
