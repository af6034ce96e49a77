package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
)

// LockAcquire implements driver.LockExecutor. A concurrent acquirer of the
// same name waits on the primary key for the first one's transaction, then
// re-evaluates the WHERE of DO UPDATE against the committed row, so two
// callers never both take a live lease.
func (e *executor) LockAcquire(ctx context.Context, p *driver.LockAcquireParams) (bool, error) {
	name, owner, now, until := p.Name, p.Owner, p.Now, p.Until
	var ok bool
	err := e.db.QueryRow(ctx, e.d.expand(`INSERT INTO {{table}}idem_lock AS l (name, owner, expires_at)
		VALUES ($1, $2, $4)
		ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
		WHERE l.expires_at <= $3 OR l.owner = EXCLUDED.owner
		RETURNING true`), name, owner, now, until).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, mapErr("lock acquire", err)
	}
	return ok, nil
}

// LockRenew implements driver.LockExecutor.
func (e *executor) LockRenew(ctx context.Context, p *driver.LockRenewParams) error {
	name, owner, until := p.Name, p.Owner, p.Until
	tag, err := e.db.Exec(ctx, e.d.expand(`UPDATE {{table}}idem_lock SET expires_at = $3
		WHERE name = $1 AND owner = $2`), name, owner, until)
	if err != nil {
		return mapErr("lock renew", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: lock renew %q: %w", name, driver.ErrLeaseLost)
	}
	return nil
}

// LockRelease implements driver.LockExecutor.
func (e *executor) LockRelease(ctx context.Context, p *driver.LockReleaseParams) error {
	name, owner := p.Name, p.Owner
	tag, err := e.db.Exec(ctx, e.d.expand(`DELETE FROM {{table}}idem_lock WHERE name = $1 AND owner = $2`), name, owner)
	if err != nil {
		return mapErr("lock release", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: lock release %q: %w", name, driver.ErrLeaseLost)
	}
	return nil
}

// LockGet implements driver.LockExecutor.
func (e *executor) LockGet(ctx context.Context, p *driver.LockGetParams) (string, time.Time, error) {
	name := p.Name
	var owner string
	var expires time.Time
	err := e.db.QueryRow(ctx, e.d.expand(`SELECT owner, expires_at FROM {{table}}idem_lock WHERE name = $1`), name).Scan(&owner, &expires)
	if err != nil {
		return "", time.Time{}, mapErr("lock get", err)
	}
	return owner, expires, nil
}
