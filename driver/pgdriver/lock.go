package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// LockAcquire implements driver.LockExecutor. A concurrent acquirer of the
// same name waits on the primary key for the first one's transaction, then
// re-evaluates the WHERE of DO UPDATE against the committed row, so two
// callers never both take a live lease.
func (e *executor) LockAcquire(ctx context.Context, p *driver.LockAcquireParams) (bool, error) {
	name, owner, now, until := p.Name, p.Owner, p.Now, p.Until
	var ok bool
	err := e.db.QueryRow(ctx, e.d.expand(pgsql.LockAcquireSQL), name, owner, now, until).Scan(&ok)
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
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.LockRenewSQL), name, owner, until)
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
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.LockReleaseSQL), name, owner)
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
	err := e.db.QueryRow(ctx, e.d.expand(pgsql.LockGetSQL), name).Scan(&owner, &expires)
	if err != nil {
		return "", time.Time{}, mapErr("lock get", err)
	}
	return owner, expires, nil
}
