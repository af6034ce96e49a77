package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/leaseowner"
)

// RelayLockName is the lease (table idem_lock, under the driver's table
// prefix) that lets one relay at a time publish the outbox of a database
// without concurrent writers (SQLite).
const RelayLockName = "idem-outbox-relay"

// DefaultRelayLease is the default RelayConfig.Lease.
const DefaultRelayLease = 15 * time.Second

// minLease is the shortest RelayConfig.Lease: renewals go every Lease/3.
const minLease = 100 * time.Millisecond

// ErrStandby is returned by RunOnce on SQLite when another relay holds the
// database's relay lease (RelayLockName): it publishes the outbox, this one
// published nothing.
var ErrStandby = errors.New("outbox: another relay publishes this database's outbox (relay lease held)")

// relayLease is the lease of a relay on a backend without concurrent
// writers: the claims of two relays there would read the same events.
type relayLease struct {
	ex    driver.LockExecutor
	owner string

	// mu serialises taking and releasing the lease. holders counts the
	// calls of this relay (its Run, its RunOnce calls) that hold it: they
	// share one owner, so the last one to end releases it, not the first
	// (which freed it while another's round still published, and a
	// standby relay published the same events at once).
	mu      sync.Mutex
	holders int
}

// holdLease takes (or extends) the relay lease for a caller of this relay
// (see acquireLease); when it returns true the caller holds it until it
// calls dropLease.
func (r *Relay[TTx]) holdLease(ctx context.Context) (bool, time.Time, error) {
	r.lease.mu.Lock()
	defer r.lease.mu.Unlock()
	ok, until, err := r.acquireLease(ctx)
	if ok {
		r.lease.holders++
	}
	return ok, until, err
}

// dropLease ends a hold of holdLease, and releases the lease when no other
// caller of this relay holds it.
func (r *Relay[TTx]) dropLease(ctx context.Context) {
	r.lease.mu.Lock()
	defer r.lease.mu.Unlock()
	r.lease.holders--
	if r.lease.holders == 0 {
		r.releaseLease(ctx)
	}
}

// The lease's times are the wall clock (time.Now), not RelayConfig.Now: a
// lease is shared with other processes, and the relays of one SQLite file
// run on one host, so they read the same clock.

// acquireLease takes (or extends) the relay lease. It returns whether this
// relay holds it, and until when (counted from a clock reading taken
// before the statement, so never later than the expiry other relays see).
func (r *Relay[TTx]) acquireLease(ctx context.Context) (bool, time.Time, error) {
	now := time.Now()
	until := now.Add(r.cfg.Lease)
	ok, err := r.lease.ex.LockAcquire(ctx, &driver.LockAcquireParams{Name: RelayLockName, Owner: r.lease.owner, Now: now, Until: until})
	if err != nil {
		return false, time.Time{}, fmt.Errorf("outbox: acquire relay lease %q: %w", RelayLockName, err)
	}
	return ok, until, nil
}

// releaseLease deletes the lease so that a standby relay takes over at once.
func (r *Relay[TTx]) releaseLease(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := r.lease.ex.LockRelease(ctx, &driver.LockReleaseParams{Name: RelayLockName, Owner: r.lease.owner})
	if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		r.cfg.Logger.Warn("outbox: could not release the relay lease; a standby relay takes over when it expires",
			"lock", RelayLockName, "lease", r.cfg.Lease, "err", err)
	}
}

// leaseGuard is how long before the lease's expiry a relay stops
// publishing when renewals failed: the round in flight gets that long to
// see its context end and mark what it published before another relay may
// take the lease over.
func (r *Relay[TTx]) leaseGuard() time.Duration { return r.cfg.Lease / 4 }

// keepLease renews the relay lease every Lease/3 until stop is called, as
// cleanup's lease does (leaseowner.Keep). The returned context is cancelled
// with an error wrapping driver.ErrLeaseLost when another relay took the
// lease over, or when renewals failed until Lease/4 before its expiry (also
// while a renewal hangs): the relay stops publishing while it still holds
// the lease, so the round in flight ends before a standby may take over.
//
// validUntil is the expiry the lease was acquired with.
func (r *Relay[TTx]) keepLease(parent context.Context, validUntil time.Time) (ctx context.Context, stop func()) {
	r.leaseUntil.Store(validUntil.UnixNano())
	return leaseowner.Keep(parent, leaseowner.Keeper{
		Lease: r.cfg.Lease,
		Guard: r.leaseGuard(),
		Now:   time.Now,
		Renew: func(ctx context.Context, until time.Time) error {
			return r.lease.ex.LockRenew(ctx, &driver.LockRenewParams{Name: RelayLockName, Owner: r.lease.owner, Until: until})
		},
		Renewed: func(until time.Time) { r.leaseUntil.Store(until.UnixNano()) },
		What:    "outbox: relay lease",
		Name:    RelayLockName,
		Other:   "another relay",
		Logger:  r.cfg.Logger,
	}, validUntil)
}

// standbyInterval is how often a standby relay tries to take the lease:
// at once after a release, within Lease after the active relay died.
func (r *Relay[TTx]) standbyInterval() time.Duration {
	return max(min(r.cfg.PollInterval, r.cfg.Lease/3), minBackoff)
}

// leaseReport reports to RelayConfig.OnLease whether Run publishes: the
// first state, then only its changes.
type leaseReport struct {
	fn          func(held bool)
	known, held bool
}

func (l *leaseReport) set(held bool) {
	if l.fn == nil || (l.known && l.held == held) {
		return
	}
	l.known, l.held = true, held
	l.fn(held)
}

// end reports, when Run returns, that a relay that published no longer
// does.
func (l *leaseReport) end() {
	if l.held {
		l.set(false)
	}
}

// runLeased is Run on a backend without concurrent writers: the relay
// publishes only while it holds the lease, and stands by otherwise.
func (r *Relay[TTx]) runLeased(ctx context.Context, wakeUp <-chan struct{}) {
	standby := false
	failures := 0
	report := leaseReport{fn: r.cfg.OnLease}
	defer report.end()
	for {
		ok, until, err := r.holdLease(ctx)
		if ctx.Err() != nil {
			if ok {
				r.dropLease(ctx)
			}
			return
		}
		report.set(ok)
		if err != nil {
			failures++
			if failures == 1 || failures%100 == 0 {
				r.cfg.Logger.Error("outbox: relay lease unavailable; not publishing", "err", err, "consecutive_failures", failures)
			}
		} else {
			if failures > 0 {
				// The error above must not be the last word.
				if ok {
					standby = false
					r.cfg.Logger.Info("outbox: relay lease available again; publishing", "lock", RelayLockName, "consecutive_failures", failures)
				} else {
					standby = true
					r.cfg.Logger.Info("outbox: relay lease reachable again; another relay publishes this database's outbox, standing by", "lock", RelayLockName, "consecutive_failures", failures)
				}
			}
			failures = 0
		}
		if !ok {
			if err == nil && !standby {
				standby = true
				r.cfg.Logger.Info("outbox: another relay publishes this database's outbox; standing by", "lock", RelayLockName, "lease", r.cfg.Lease)
			}
			if err == nil {
				// The lag is the database's: a standby's gauge must
				// not keep what it reported when it last published.
				r.reportLag(ctx, false)
			}
			if !backoff.Sleep(ctx, r.standbyInterval(), nil) {
				return
			}
			continue
		}
		if standby {
			r.cfg.Logger.Info("outbox: relay lease taken over; publishing", "lock", RelayLockName)
			standby = false
		}
		if lost := r.publishLeased(ctx, until, wakeUp); lost == nil {
			return
		} else {
			report.set(false)
			r.cfg.Logger.Warn("outbox: relay lease lost; standing by", "err", lost)
		}
	}
}

// publishLeased runs the loop while the lease acquired (holdLease) until
// until is held. It returns nil when ctx ended, or why the lease was lost.
// Either way (and on a panic, a crashed publisher) the round in flight has
// ended, its marks committed or not, when it releases the lease (unless a
// RunOnce of this relay holds it too, which then releases it): a standby
// takes over at once.
func (r *Relay[TTx]) publishLeased(ctx context.Context, until time.Time, wakeUp <-chan struct{}) error {
	lctx, stop := r.keepLease(ctx, until)
	defer func() {
		stop()
		r.dropLease(ctx)
	}()
	r.loop(lctx, wakeUp)
	if ctx.Err() != nil {
		return nil
	}
	return context.Cause(lctx)
}

// runOnceLeased is RunOnce on a backend without concurrent writers: one
// round under the lease, ErrStandby when another relay holds it. The lease
// is released after the round, unless this relay's Run or another of its
// RunOnce calls holds it.
func (r *Relay[TTx]) runOnceLeased(ctx context.Context) (roundResult, error) {
	ok, until, err := r.holdLease(ctx)
	if err != nil {
		return roundResult{}, err
	}
	if !ok {
		return roundResult{}, ErrStandby
	}
	lctx, stop := r.keepLease(ctx, until)
	defer func() {
		stop()
		r.dropLease(ctx)
	}()
	res, err := r.round(lctx)
	if err != nil && ctx.Err() == nil && lctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", err, context.Cause(lctx))
	}
	return res, err
}
