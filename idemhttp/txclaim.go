package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/observe"
)

// maxLeaseLost bounds the handler's executions for one request when the
// completed record's INSERT keeps finding the key taken (see serveTxClaim).
const maxLeaseLost = 3

// serveTxClaim is ModeTx over a driver.TxClaimer: as many round trips as
// the handler alone (the key's lock with the read of its record; the
// handler's statements, the first one with BEGIN; the completed record with
// COMMIT) and one record write; a replay of a completed record takes one
// round trip and no transaction (pgdriver). A concurrent duplicate finds
// the lock taken, waits for it (bounded by Config.Wait), then replays the
// record its holder committed, or executes if the holder rolled back.
func (m *Middleware[TTx]) serveTxClaim(tc driver.TxClaimer[TTx], cmd *command, next http.Handler) {
	ctx := cmd.r.Context()
	waited := false
	lost := 0 // records stored by another writer while the handler ran
	// turn is the key's turn to wait in the store (waitGates) while this
	// request holds it: given back once the claim returned, or when a
	// hook or the driver panics.
	var turn func()
	defer func() {
		if turn != nil {
			turn()
		}
	}()
	for polls := 0; ; polls++ {
		p := &driver.TxClaimParams{Scope: cmd.scope, Key: cmd.key, Now: m.cfg.Now()}
		if waited {
			// Another transaction holds the key: wait for it, bounded,
			// holding a connection only when no other duplicate of this
			// middleware waits for it already.
			if p.Wait = m.waitLeft(cmd); p.Wait <= 0 {
				m.inProgress(cmd)
				return
			}
			var ok bool
			if turn, ok = m.waits.acquire(ctx, cacheKey{cmd.scope, cmd.key}, p.Wait); !ok {
				if ctx.Err() == nil {
					m.inProgress(cmd)
				}
				return
			}
			if p.Wait = m.waitLeft(cmd); p.Wait <= 0 {
				m.inProgress(cmd)
				return
			}
		}
		span := m.span(cmd, "idem.http.claim")
		tx, res, err := tc.BeginClaim(ctx, p)
		if turn != nil {
			// The next duplicate waits for this request's lock, if it
			// got it.
			turn()
			turn = nil
		}
		if err == nil && res.Locked {
			switch m.lockedTx(cmd, next, tc, tx, res.Record, span) {
			case lockedAnswered:
				return
			case lockedInProgress:
				// In progress under a lease: a ModeLease middleware shares
				// the scope (its claims take no lock): poll.
				if m.waitLeft(cmd) <= 0 {
					m.inProgress(cmd)
					return
				}
				if pause(ctx, pollDelay(polls)) != nil {
					return
				}
			case lockedLost:
				// Someone without the lock stored the key meanwhile: our
				// writes were rolled back; look again (the next claim finds
				// the record). A driver that keeps reporting it would run
				// the handler again and again: after a few, answer that the
				// store failed.
				if lost++; lost >= maxLeaseLost {
					m.storeUnavailable(cmd, fmt.Errorf("idemhttp: the key's record was reported stored by another writer %d times, and not found", lost))
					return
				}
			}
			waited = false
			continue
		}
		m.endClaim(span, false, err)
		if err != nil {
			switch {
			case errors.Is(err, driver.ErrLockTimeout):
				m.inProgress(cmd) // the store's own lock wait (SQLite's busy timeout) ran out
			case ctx.Err() == nil:
				m.storeUnavailable(cmd, err)
			}
			return
		}
		if res.Record != nil {
			// A completed record, read without a lock or a transaction:
			// a replay, or a mismatch.
			m.answerCompleted(cmd, res.Record)
			return
		}
		if waited {
			m.inProgress(cmd) // the wait budget ran out
			return
		}
		waited = true
	}
}

// What lockedTx did with the key.
type lockedResult uint8

const (
	lockedAnswered   lockedResult = iota // the request is answered
	lockedInProgress                     // in progress under a lease: poll
	lockedLost                           // stored by another writer meanwhile: claim again
)

// lockedTx answers cmd from rec, the key's record read under its lock in
// tx (nil if none), or executes the command in tx. It holds tx
// (holdGuard) until tx ends; claim is the claim's span, to end.
func (m *Middleware[TTx]) lockedTx(cmd *command, next http.Handler, tc driver.TxClaimer[TTx], tx TTx, rec *driver.Record, claim observe.Span) lockedResult {
	ctx := cmd.r.Context()
	cmd.hold()
	defer m.holdGuard(cmd, tx, nil, "") // also when the handler or a hook panics
	m.endClaim(claim, rec == nil || rec.State != driver.StateCompleted, nil)
	if rec != nil {
		now := m.cfg.Now()
		abandoned := rec.State == driver.StateInProgress && !rec.LeaseExpiresAt.After(now) &&
			bytes.Equal(rec.Fingerprint, cmd.fingerprint)
		if rec.ExpiresAt.After(now) && !abandoned {
			// The transaction only read. It ends before the answer is
			// written: a client that reads a large body slowly (or never)
			// must not hold the key's lock, a connection and, on SQLite,
			// the database's only writer while it does.
			m.rollbackHeld(ctx, cmd, tx)
			if rec.State == driver.StateCompleted || !bytes.Equal(rec.Fingerprint, cmd.fingerprint) {
				m.answerCompleted(cmd, rec) // a replay or a mismatch
				return lockedAnswered
			}
			return lockedInProgress
		}
	}
	if ctx.Err() != nil {
		// The request ended as the key was locked (see claimTx): the
		// handler does not run. Answered by the caller.
		m.rollbackHeld(ctx, cmd, tx)
		return lockedAnswered
	}
	cmd.held.span, cmd.held.orig = m.enter(cmd, "idem.http.execute")
	if m.executeTxClaim(cmd, next, tc, tx, rec != nil) {
		return lockedLost
	}
	return lockedAnswered
}

// answerCompleted answers a replay or a mismatch from rec and flushes it.
func (m *Middleware[TTx]) answerCompleted(cmd *command, rec *driver.Record) {
	if rec.State == driver.StateCompleted && bytes.Equal(rec.Fingerprint, cmd.fingerprint) && !storedTrailers(rec.Headers) {
		// Flushed before the handler returns, the body would otherwise go
		// out chunked, an empty one too (the original had Content-Length:
		// 0; net/http drops it for a status without a body). Trailers
		// follow a chunked body, as the first time.
		cmd.w.Header().Set("Content-Length", strconv.Itoa(len(rec.Body)))
	}
	m.answerExisting(cmd, rec)
	_ = http.NewResponseController(cmd.w).Flush()
}

// executeTxClaim runs the handler in tx and commits its writes with the
// completed record, or rolls everything back. It returns true when the
// record was stored by another writer meanwhile (nothing was committed and
// nothing answered: the caller claims again).
func (m *Middleware[TTx]) executeTxClaim(cmd *command, next http.Handler, tc driver.TxClaimer[TTx], tx TTx, replace bool) (again bool) {
	ctx := cmd.r.Context()
	rec := m.runInTx(cmd, next, tx)
	if rec == nil {
		return false
	}
	headers, err := encodeHeaders(rec.header, m.replayHeaders)
	if err != nil {
		m.rollbackHeld(ctx, cmd, tx)
		m.storeUnavailable(cmd, err)
		return false
	}
	now := m.cfg.Now()
	stored := &driver.Record{
		Scope: cmd.scope, Key: cmd.key, Fingerprint: cmd.fingerprint, State: driver.StateCompleted,
		Status: rec.statusCode(), Headers: headers, Body: rec.body.Bytes(),
		CreatedAt: now, ExpiresAt: now.Add(m.cfg.TTL),
	}
	cmd.decided()
	// Bounded (CommitTimeout): a COMMIT that PostgreSQL does not answer
	// must not hold the request, its connection and the key for hours.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CommitTimeout)
	err = tc.CommitComplete(cctx, tx, &driver.TxCompleteParams{
		Scope: stored.Scope, Key: stored.Key, Fingerprint: stored.Fingerprint,
		Status: stored.Status, Headers: stored.Headers, Body: stored.Body,
		CreatedAt: stored.CreatedAt, ExpiresAt: stored.ExpiresAt, Replace: replace,
	})
	err = m.commitTimedOut(cctx, err)
	cancel()
	switch {
	case errors.Is(err, driver.ErrLeaseLost):
		return true
	case errors.Is(err, driver.ErrTxDone) && ctx.Err() != nil:
		// database/sql rolled the transaction back when the request's
		// context ended, after the handler returned: nothing committed,
		// and not the handler's doing.
		m.requestEnded(cmd)
		m.reportCmd(cmd, OutcomeNotStored)
		return false
	case m.handlerTxFailed(cmd, err), m.idleTimedOut(cmd, err), m.roleRefused(cmd, err):
		return false
	case errors.Is(err, driver.ErrNotCommitted):
		// The server refused the record's write or the COMMIT: rolled
		// back, the outcome is known.
		m.storeUnavailable(cmd, err)
		return false
	case err != nil:
		// The COMMIT was in the same round trip: it may have happened.
		m.outcomeUnknown(cmd, err)
		return false
	}
	// Committed: the replay cache may answer retries, until the stored
	// record's expiry as the store keeps it (cachedExpiry).
	stored.ExpiresAt = cachedExpiry(stored.ExpiresAt)
	m.remember(cmd, stored)
	rec.flush(cmd.w)
	m.reportCmd(cmd, OutcomeExecuted)
	return false
}
