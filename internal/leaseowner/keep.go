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
	// Lease is the lease's duration: it is renewed every Lease/3, each
	// renewal bounded by Lease/3.
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

// Keep renews the lease, valid until validUntil, until stop is called. The
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
		tick := time.NewTicker(k.Lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			until := k.Now().Add(k.Lease)
			rctx, rcancel := context.WithTimeout(ctx, k.Lease/3)
			err := k.Renew(rctx, until)
			rcancel()
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
