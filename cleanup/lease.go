package cleanup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/leaseowner"
)

// acquire takes (or extends) the sweep lease at now, within Lease/3, as a
// renewal: a statement sent on a connection the network black-holes (a
// partition that resets nothing) fails the sweep then, instead of waiting
// as long as TCP does with no sweep run meanwhile.
func (c *Cleaner[TTx]) acquire(ctx context.Context, now time.Time) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Lease/3)
	defer cancel()
	ok, err := c.drv.Executor().LockAcquire(ctx, &driver.LockAcquireParams{Name: c.cfg.LockName, Owner: c.owner, Now: now, Until: now.Add(c.cfg.Lease)})
	if err != nil {
		return false, fmt.Errorf("cleanup: acquire lease %q: %w", c.cfg.LockName, err)
	}
	return ok, nil
}

// keepLease renews the lease every Lease/3 until stop is called
// (leaseowner.Keep). The returned context is cancelled with an error
// wrapping driver.ErrLeaseLost when another owner took the lease over, or
// when renewals kept failing until the lease expired, or when it expired
// while a renewal hung: from then on another replica may sweep, so this one
// stops.
//
// validUntil is the expiry the lease was acquired with.
func (c *Cleaner[TTx]) keepLease(parent context.Context, validUntil time.Time) (ctx context.Context, stop func()) {
	ex := c.drv.Executor()
	return leaseowner.Keep(parent, leaseowner.Keeper{
		Lease: c.cfg.Lease,
		Now:   c.cfg.Now,
		Renew: func(ctx context.Context, until time.Time) error {
			return ex.LockRenew(ctx, &driver.LockRenewParams{Name: c.cfg.LockName, Owner: c.owner, Until: until})
		},
		What:   "cleanup: lease",
		Name:   c.cfg.LockName,
		Other:  "another replica",
		Logger: c.cfg.Logger,
	}, validUntil)
}

// finish keeps the lease for Config.Hold after a completed sweep, so that
// replicas woken slightly later by the same schedule skip it; after a failed
// or cancelled sweep, or with NoHold, it releases the lease at once.
func (c *Cleaner[TTx]) finish(ctx context.Context, completed bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	ex := c.drv.Executor()
	var err error
	if completed && c.cfg.Hold != NoHold {
		err = ex.LockRenew(ctx, &driver.LockRenewParams{Name: c.cfg.LockName, Owner: c.owner, Until: c.cfg.Now().Add(c.cfg.Hold)})
	} else {
		err = ex.LockRelease(ctx, &driver.LockReleaseParams{Name: c.cfg.LockName, Owner: c.owner})
	}
	if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		c.cfg.Logger.Warn("cleanup: could not hold or release the lease; it expires on its own", "lock", c.cfg.LockName, "err", err)
	}
}
