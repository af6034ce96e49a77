package leaseowner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idem/driver"
)

// Keeper describes a held lease for Keep.
type Keeper struct {
	// Lease is the lease's duration: it is renewed every Lease/3 (a failed
	// renewal is retried after RetryDelay), each renewal bounded by
	// Lease/3.
	Lease time.Duration
	// Guard: the holder stops this long before an unrenewed lease expires
	// (0: at its expiry).
	Guard time.Duration
	// Now is the clock the lease's times are read on.
	Now func() time.Time
	// Renew extends the lease until until; an error wrapping
	// driver.ErrLeaseLost means another owner holds it.
	Renew func(ctx context.Context, until time.Time) error
	// Renewed, if set, is called with the new expiry after each renewal.
	Renewed func(until time.Time)
	// What names the kind of lease in errors and logs ("outbox: relay
	// lease"), Name the lease, Other its competitors ("another relay").
	What, Name, Other string
	Logger            *slog.Logger
}

// RetryDelay is how long a lease's holder waits after its failed-th failed
// renewal in a row before the next attempt: 100ms, doubling, at most
// interval (the renewal interval). A renewal that failed at once (its
// connection found dead: a DBA's pg_terminate_backend, a failover) goes
// again on a new connection with most of the lease left, instead of an
// interval later with a third of it; a store that stays down is tried at
// the interval again after a few seconds.
func RetryDelay(failed int, interval time.Duration) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < failed && d < interval; i++ {
		d *= 2
	}
	return min(d, interval)
}

// Keep renews the lease, valid until validUntil, until stop is called
// (every Lease/3; a failed renewal is retried after RetryDelay). The
// returned context is cancelled with an error wrapping driver.ErrLeaseLost
// when another owner took the lease over, or when renewals failed until
// Guard before its expiry, or when that moment came while a renewal hung
// (a timer, so a dead connection cannot keep the holder going): from then
// on another owner may take the lease, so the holder stops.
//
// validUntil is the expiry the lease was acquired with: counting from a
// later clock reading would let the holder go on past the moment another
// one may take the lease over.
func Keep(parent context.Context, k Keeper, validUntil time.Time) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	expired := "expired"
	if k.Guard > 0 {
		expired = "about to expire"
	}
	left := func() time.Duration { return validUntil.Sub(k.Now()) - k.Guard }
	expiry := time.AfterFunc(left(), func() {
		cancel(fmt.Errorf("%s %q %s, not renewed in time: %w", k.What, k.Name, expired, driver.ErrLeaseLost))
	})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		interval := k.Lease / 3
		tick := time.NewTimer(interval)
		defer tick.Stop()
		failed := 0 // renewals failed in a row
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			until := k.Now().Add(k.Lease)
			rctx, rcancel := context.WithTimeout(ctx, interval)
			err := k.Renew(rctx, until)
			rcancel()
			if err == nil {
				failed = 0
				tick.Reset(interval)
			} else {
				failed++
				tick.Reset(RetryDelay(failed, interval))
			}
			switch {
			case err == nil:
				validUntil = until
				if ctx.Err() == nil {
					if k.Renewed != nil {
						k.Renewed(validUntil)
					}
					expiry.Reset(left())
				}
			case errors.Is(err, driver.ErrLeaseLost):
				cancel(fmt.Errorf("%s %q taken over by %s: %w", k.What, k.Name, k.Other, driver.ErrLeaseLost))
				return
			case ctx.Err() != nil:
				return
			case left() <= 0:
				cancel(fmt.Errorf("%s %q %s, renewals failed: %w: %w", k.What, k.Name, expired, driver.ErrLeaseLost, err))
				return
			default:
				k.Logger.Warn(k.What+" renewal failed; retrying", "lock", k.Name, "err", err)
			}
		}
	})
	return ctx, func() {
		expiry.Stop()
		close(done)
		wg.Wait()
		cancel(nil)
	}
}
