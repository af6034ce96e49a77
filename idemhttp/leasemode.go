package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/leaseowner"
	"github.com/idemkit/idem/observe"
)

// serveLease runs cmd in lease mode: claim with an in-progress record (its
// own statement), run the handler while renewing the lease, then store the
// response or release the key. A duplicate polls the record until it is
// completed or released, bounded by Config.Wait.
func (m *Middleware[TTx]) serveLease(cmd *command, next http.Handler) {
	ctx := cmd.r.Context()
	ex := m.drv.Records()
	for polls := 0; ; polls++ {
		p := m.claimParams(cmd, m.lockTimeout(cmd))
		span := m.span(cmd, "idem.http.claim")
		res, err := ex.RecordClaim(ctx, p)
		if err == nil && res.Claimed {
			m.leased(cmd, next, ex, p, span)
			return
		}
		m.endClaim(span, false, err)
		if err != nil {
			if errors.Is(err, driver.ErrLockTimeout) {
				m.inProgress(cmd) // the claim waited for the row and gave up: nothing written
				return
			}
			if ctx.Err() == nil {
				m.storeUnavailable(cmd, err)
			}
			if !errors.Is(err, driver.ErrNotMigrated) {
				// The claim may have committed with its reply lost: the
				// request ended during it (the client went away, or its
				// deadline passed), or its round trip failed after the
				// store committed it (the connection broke). Nothing
				// would complete or release it, and every retry would
				// get 409 until the lease expires, though the handler
				// never ran. Released by its token (only if it is still
				// ours), in the background: the answer must not wait for
				// a store that just failed or was too slow.
				go m.release(context.WithoutCancel(ctx), ex, cmd, p.LeaseToken)
			}
			return
		}
		if m.answerExisting(cmd, res.Existing) {
			return
		}
		if m.waitLeft(cmd) <= 0 {
			m.inProgress(cmd)
			return
		}
		if pause(ctx, pollDelay(polls)) != nil {
			return
		}
	}
}

// leased runs cmd under the lease p just claimed; claim is the claim's
// span, to end. It holds the key (holdGuard) until its outcome is stored
// or the key released: a panic of the handler or of a hook meanwhile
// (Config.Store, Config.Now, Config.Tracer's spans) releases the key at
// once and goes on.
func (m *Middleware[TTx]) leased(cmd *command, next http.Handler, ex driver.RecordExecutor, p *driver.RecordClaimParams, claim observe.Span) {
	var none TTx
	cmd.hold()
	defer m.holdGuard(cmd, none, ex, p.LeaseToken) // also when the handler or a hook panics
	m.endClaim(claim, true, nil)
	until, ok := m.freshLease(cmd, ex, p)
	if !ok {
		return
	}
	if cmd.r.Context().Err() != nil {
		// The request ended as the key was claimed: the handler does not
		// run on a dead context. holdGuard releases the lease; the caller
		// answers.
		return
	}
	cmd.held.span, cmd.held.orig = m.enter(cmd, "idem.http.execute")
	m.executeLease(cmd, next, ex, p.LeaseToken, until)
}

// freshLease makes sure the lease just claimed is good for a full
// Config.Lease before the handler runs. The claim's times were computed
// before it waited for the record's row (up to Config.Wait); if that took
// more than a heartbeat interval, the lease written may be short or already
// expired, and a duplicate could take over from a live owner. It is renewed
// first; a lease already taken over answers 409, and a renewal that fails
// (or does not answer within Config.Lease/3) releases the key and answers
// 503, the handler not run in either case. It returns when the lease
// written ends.
func (m *Middleware[TTx]) freshLease(cmd *command, ex driver.RecordExecutor, p *driver.RecordClaimParams) (time.Time, bool) {
	if m.cfg.Now().Sub(p.Now) < m.cfg.Lease/3 {
		return p.LeaseExpiresAt, true
	}
	ctx := cmd.r.Context()
	until := m.cfg.Now().Add(m.cfg.Lease)
	// Bounded like the heartbeat's renewals: one stuck on a dead
	// connection fails the request (503, the key released) instead of
	// holding it for as long as the client waits.
	rctx, cancel := context.WithTimeout(ctx, m.cfg.Lease/3)
	err := ex.RecordExtendLease(rctx, &driver.RecordExtendLeaseParams{Scope: cmd.scope, Key: cmd.key, LeaseToken: p.LeaseToken, Until: until})
	cancel()
	if err != nil {
		cmd.decided() // lost, or released below
	}
	switch {
	case err == nil:
		return until, true
	case errors.Is(err, driver.ErrLeaseLost):
		m.inProgress(cmd)
	default:
		m.release(context.WithoutCancel(ctx), ex, cmd, p.LeaseToken)
		if ctx.Err() == nil {
			m.storeUnavailable(cmd, err)
		}
	}
	return time.Time{}, false
}

// Storing a lease-mode outcome is retried on errors other than a lost
// lease, completeAttempts times in all, completeRetryDelay*n apart: well
// within the lease left after the last renewal (at least 2/3 of
// Config.Lease, which is at least 1s). An outcome not stored leaves the key
// in progress until its lease expires, and then a retry executes again.
const (
	completeAttempts   = 3
	completeRetryDelay = 50 * time.Millisecond
)

// executeLease runs the handler under a renewed lease (the one written ends
// at until) and records its outcome. A handler that produced a storable response is stored even if the
// client went away meanwhile: its external effect happened, and releasing
// the key would let a retry execute it again.
func (m *Middleware[TTx]) executeLease(cmd *command, next http.Handler, ex driver.RecordExecutor, token string, until time.Time) {
	ctx := cmd.r.Context()
	bg := context.WithoutCancel(ctx)
	// The handler's context ends (cause driver.ErrLeaseLost) when the
	// lease is lost: another request may take the key over, and a handler
	// that watches its context must not make its call then.
	hctx, lost := context.WithCancelCause(context.WithValue(ctx, keyKey{}, cmd.key))
	defer lost(nil)
	stop := m.heartbeat(bg, ex, cmd, token, until, lost)
	cmd.held.stop = stop
	rec := newRecorder(m.cfg.MaxResponseBytes)
	// A panic of the handler, or of a hook until the outcome is stored,
	// releases the key (the caller's holdGuard) and goes on.
	cmd.held.state = holdRan
	next.ServeHTTP(rec, cmd.request(hctx))
	rec.seal()
	stop()

	if !m.cfg.Store(rec.statusCode()) {
		// A failure (5xx, 429, ...) is never stored, whatever its size.
		cmd.decided()
		m.release(bg, ex, cmd, token)
		m.passNotStored(cmd, rec)
		m.reportCmd(cmd, OutcomeNotStored)
		return
	}
	if rec.overflow {
		// The effect happened and cannot be undone: releasing the key would
		// let a retry execute it again. Store the 500 answer instead, so
		// every retry gets it.
		rec = newRecorder(math.MaxInt)
		m.writeTooLarge(rec, cmd, "The command was executed but its response is too large to store; retries with this key get this answer.")
	}
	err := m.completeBounded(bg, ex, cmd, token, rec)
	for n := 1; n < completeAttempts && err != nil && !errors.Is(err, driver.ErrLeaseLost); n++ {
		m.cfg.Logger.WarnContext(cmd.r.Context(), "idemhttp: storing the response failed; retrying", "key", cmd.key, "scope", logScope(cmd.scope), "err", err)
		_ = pause(bg, time.Duration(n)*completeRetryDelay)
		if err = m.completeBounded(bg, ex, cmd, token, rec); errors.Is(err, driver.ErrLeaseLost) && m.storedEarlier(bg, ex, cmd) {
			// The failed attempt had committed (its answer was lost):
			// the record holds this very outcome.
			err = nil
		}
	}
	cmd.decided() // stored, or left to its lease (see completeAttempts)
	if err != nil {
		if errors.Is(err, driver.ErrLeaseLost) {
			m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: lease lost before the response was stored; another request may have executed the command too",
				"key", cmd.key, "scope", logScope(cmd.scope))
		} else {
			m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: response not stored; a retry after the lease expires executes again",
				"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
		}
	} else {
		m.rememberCompleted(cmd) // stored: the replay cache may answer retries
	}
	rec.flush(cmd.w)
	if err != nil {
		m.traceFailure(cmd, err)
		m.reportCmd(cmd, OutcomeNotStored) // executed, but a retry may execute again
		return
	}
	m.reportCmd(cmd, OutcomeExecuted)
}

// storedEarlier reports whether the record of cmd is completed with the
// outcome complete stored for it (cmd.completed): a retried store that
// finds the lease gone because its failed predecessor committed.
func (m *Middleware[TTx]) storedEarlier(ctx context.Context, ex driver.RecordExecutor, cmd *command) bool {
	p := cmd.completed
	if p == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, m.completeTimeout())
	defer cancel()
	r, err := ex.RecordGet(ctx, &driver.RecordGetParams{Scope: cmd.scope, Key: cmd.key})
	return err == nil && r.State == driver.StateCompleted && bytes.Equal(r.Fingerprint, cmd.fingerprint) &&
		r.Status == p.Status && bytes.Equal(r.Headers, p.Headers) && bytes.Equal(r.Body, p.Body)
}

// heartbeat renews the lease, written to end at until, every Lease/3 until
// the returned stop is called, and retries a failed renewal after 100ms
// (doubling up to Lease/3); stop waits for the renewer to exit (at most
// one renewal, bounded by Lease/3). When the lease ends without a
// successful renewal (a timer, so also while a renewal hangs), lost is
// called: another request may take the key over from then on.
func (m *Middleware[TTx]) heartbeat(ctx context.Context, ex driver.RecordExecutor, cmd *command, token string, until time.Time, lost context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex // guards expiry's re-arming against its firing
	expired, stopped := false, false
	expiry := time.AfterFunc(until.Sub(m.cfg.Now()), func() {
		mu.Lock()
		defer mu.Unlock()
		expired = true
		m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: lease expired (not renewed in time) while the handler runs; its context is cancelled",
			"key", cmd.key, "scope", logScope(cmd.scope))
		lost(fmt.Errorf("%w: not renewed in time", driver.ErrLeaseLost))
	})
	wg.Go(func() {
		interval := m.cfg.Lease / 3
		t := time.NewTimer(interval)
		defer t.Stop()
		failed := 0 // renewals failed in a row
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			// Each renewal is bounded by the interval: one stuck on a dead
			// connection must not outlive the lease it should extend.
			rctx, cancel := context.WithTimeout(ctx, interval)
			next := m.cfg.Now().Add(m.cfg.Lease)
			err := ex.RecordExtendLease(rctx, &driver.RecordExtendLeaseParams{Scope: cmd.scope, Key: cmd.key, LeaseToken: token, Until: next})
			cancel()
			if err == nil {
				failed = 0
				t.Reset(interval)
			} else {
				// A failed renewal is retried soon, not an interval later:
				// the one that found its connection dead (a DBA's
				// pg_terminate_backend, a failover) goes again on a new
				// one with two thirds of the lease left, instead of one
				// third. The delay doubles while the store stays down.
				failed++
				t.Reset(leaseowner.RetryDelay(failed, interval))
			}
			switch {
			case err == nil:
				until = next
				mu.Lock()
				if expired || stopped {
					mu.Unlock()
					return // too late: the handler was told, or it returned
				}
				expiry.Reset(until.Sub(m.cfg.Now()))
				mu.Unlock()
			case errors.Is(err, driver.ErrLeaseLost):
				m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: lease lost while the handler runs; its context is cancelled", "key", cmd.key, "scope", logScope(cmd.scope))
				lost(driver.ErrLeaseLost)
				return
			case !m.cfg.Now().Before(until):
				// Not renewed in time: the lease has ended, and another
				// request may take the key over now.
				m.cfg.Logger.ErrorContext(cmd.r.Context(), "idemhttp: lease expired (renewals failed) while the handler runs; its context is cancelled",
					"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
				lost(fmt.Errorf("%w: not renewed in time: %w", driver.ErrLeaseLost, err))
				return
			default:
				m.cfg.Logger.WarnContext(cmd.r.Context(), "idemhttp: lease renewal failed", "key", cmd.key, "scope", logScope(cmd.scope), "err", err)
			}
		}
	})
	return sync.OnceFunc(func() {
		// The handler returned: no more "while the handler runs" (a
		// renewal may hang up to Lease/3 in wg.Wait).
		mu.Lock()
		stopped = true
		expiry.Stop()
		mu.Unlock()
		close(done)
		wg.Wait()
	})
}

// completeBounded is complete with each attempt bounded like a renewal:
// the lease is no longer renewed once the handler returned, and a call
// stuck on a dead connection must give way to the retry on another one.
func (m *Middleware[TTx]) completeBounded(ctx context.Context, ex driver.RecordExecutor, cmd *command, token string, rec *recorder) error {
	ctx, cancel := context.WithTimeout(ctx, m.completeTimeout())
	defer cancel()
	return m.commitTimedOut(ctx, m.complete(ctx, ex, cmd, token, rec))
}

// completeTimeout bounds one attempt to store a lease-mode outcome, or to
// read it back (storedEarlier): Lease/3, and CommitTimeout.
func (m *Middleware[TTx]) completeTimeout() time.Duration {
	return min(m.cfg.Lease/3, m.cfg.CommitTimeout)
}

func (m *Middleware[TTx]) release(ctx context.Context, ex driver.RecordExecutor, cmd *command, token string) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Lease/3)
	defer cancel()
	if err := ex.RecordRelease(ctx, &driver.RecordReleaseParams{Scope: cmd.scope, Key: cmd.key, LeaseToken: token}); err != nil {
		m.cfg.Logger.WarnContext(cmd.r.Context(), "idemhttp: release failed; the key frees when its lease expires",
			"key", cmd.key, "scope", logScope(cmd.scope), "err", err)
	}
}
