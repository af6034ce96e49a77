package cleanup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/driver"
)

// acquire takes (or extends) the sweep lease at now.
func (c *Cleaner[TTx]) acquire(ctx context.Context, now time.Time) (bool, error) {
	ok, err := c.drv.Executor().LockAcquire(ctx, &driver.LockAcquireParams{Name: c.cfg.LockName, Owner: c.owner, Now: now, Until: now.Add(c.cfg.Lease)})
	if err != nil {
		return false, fmt.Errorf("cleanup: acquire lease %q: %w", c.cfg.LockName, err)
	}
	return ok, nil
}

// keepLease renews the lease every Lease/3 until stop is called. The
// returned context is cancelled with an error wrapping driver.ErrLeaseLost
// when another owner took the lease over, or when renewals kept failing
// until the lease expired, or when it expired while a renewal hung: from
// then on another replica may sweep, so this one stops. Each renewal is
// bounded by Lease/3.
//
// validUntil is the expiry the lease was acquired with: counting from a
// later clock reading would let this replica sweep on past the moment
// another one may take the lease over.
func (c *Cleaner[TTx]) keepLease(parent context.Context, validUntil time.Time) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	// The lease ends at validUntil unless renewed: a timer, so that the
	// sweep stops on time also while a renewal hangs (a dead connection).
	expiry := time.AfterFunc(validUntil.Sub(c.cfg.Now()), func() {
		cancel(fmt.Errorf("cleanup: lease %q expired, not renewed in time: %w", c.cfg.LockName, driver.ErrLeaseLost))
	})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ex := c.drv.Executor()
		tick := time.NewTicker(c.cfg.Lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			until := c.cfg.Now().Add(c.cfg.Lease)
			// Each renewal is bounded by the interval: the next one, on
			// another connection, goes at once.
			rctx, rcancel := context.WithTimeout(ctx, c.cfg.Lease/3)
			err := ex.LockRenew(rctx, &driver.LockRenewParams{Name: c.cfg.LockName, Owner: c.owner, Until: until})
			rcancel()
			switch {
			case err == nil:
				validUntil = until
				if ctx.Err() == nil {
					expiry.Reset(validUntil.Sub(c.cfg.Now()))
				}
			case errors.Is(err, driver.ErrLeaseLost):
				cancel(fmt.Errorf("cleanup: lease %q taken over by another replica: %w", c.cfg.LockName, driver.ErrLeaseLost))
				return
			case ctx.Err() != nil:
				return
			case !c.cfg.Now().Before(validUntil):
				cancel(fmt.Errorf("cleanup: lease %q expired, renewals failed: %w: %w", c.cfg.LockName, driver.ErrLeaseLost, err))
				return
			default:
				c.cfg.Logger.Warn("cleanup: lease renewal failed; retrying", "lock", c.cfg.LockName, "err", err)
			}
		}
	}()
	return ctx, func() {
		expiry.Stop()
		close(done)
		wg.Wait()
		cancel(nil)
	}
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
