package sqlitedriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
)

// LockAcquire implements driver.LockExecutor. SQLite serialises writers, so
// a concurrent acquirer runs after the first one committed and sees its row.
func (e *executor) LockAcquire(ctx context.Context, p *driver.LockAcquireParams) (bool, error) {
	name, owner, now, until := p.Name, p.Owner, p.Now, p.Until
	var ok bool
	err := e.db.QueryRowContext(ctx, e.d.expand(`INSERT INTO {{table}}idem_lock AS l (name, owner, expires_at)
		VALUES (?1, ?2, ?4)
		ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
		WHERE l.expires_at <= ?3 OR l.owner = excluded.owner
		RETURNING 1`), name, owner, micros(now), micros(until)).Scan(&ok)
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
	name, owner, until := p.Name, p.Owner, p.Until
	res, err := e.db.ExecContext(ctx, e.d.expand(`UPDATE {{table}}idem_lock SET expires_at = ?3
		WHERE name = ?1 AND owner = ?2`), name, owner, micros(until))
	if err != nil {
		return mapErr("lock renew", err)
	}
	return lockAffected("lock renew", name, res)
}

// LockRelease implements driver.LockExecutor.
func (e *executor) LockRelease(ctx context.Context, p *driver.LockReleaseParams) error {
	name, owner := p.Name, p.Owner
	res, err := e.db.ExecContext(ctx, e.d.expand(`DELETE FROM {{table}}idem_lock WHERE name = ?1 AND owner = ?2`), name, owner)
	if err != nil {
		return mapErr("lock release", err)
	}
	return lockAffected("lock release", name, res)
}

// LockGet implements driver.LockExecutor.
func (e *executor) LockGet(ctx context.Context, p *driver.LockGetParams) (string, time.Time, error) {
	name := p.Name
	var owner string
	var expires int64
	err := e.db.QueryRowContext(ctx, e.d.expand(`SELECT owner, expires_at FROM {{table}}idem_lock WHERE name = ?1`), name).Scan(&owner, &expires)
	if err != nil {
		return "", time.Time{}, mapErr("lock get", err)
	}
	return owner, fromMicros(expires), nil
}

func lockAffected(op, name string, res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return mapErr(op, err)
	}
	if n == 0 {
		return fmt.Errorf("sqlitedriver: %s %q: %w", op, name, driver.ErrLeaseLost)
	}
	return nil
}
