package idemhttp

import (
	"context"
	"net/http"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/observe"
)

// A claimed key is held by one function of the request from its claim
// until its fate is decided: the ModeTx transaction committed or rolled
// back (claimTx, lockedTx), the ModeLease lease completed or released
// (leased). User code runs meanwhile: the handler, and the hooks
// Config.Store, Config.Now and Config.Tracer's spans (and the driver's).
// That function defers holdGuard, which also ends the execute span: one
// deferred call where there were two (the execute span's, and the
// handler's panic guard). When a panic
// unwinds while the key is still held, the guard undoes the claim as for
// a handler that panicked (rolls the transaction back, or releases the
// lease) and the panic goes on. Without it a panicking hook leaked the
// transaction (on PostgreSQL its lock held the key: every retry answered
// 409; on SQLite it held the only connection) or left the key in progress
// until its lease expired.

// holdState is where a held key is.
type holdState uint8

const (
	holdNone    holdState = iota // not held, or its fate is decided
	holdClaimed                  // held; the handler has not run yet
	holdRan                      // held; the handler was called
)

// hold is the key held by a command, for holdGuard.
type hold struct {
	state holdState
	// span is the execute span (enter) and orig the request before it;
	// span is nil until enter.
	span observe.Span
	orig *http.Request
	// stop stops the ModeLease heartbeat once it runs.
	stop func()
}

// hold marks cmd's key claimed, in tx (ModeTx) or under a lease.
func (cmd *command) hold() { cmd.held = hold{state: holdClaimed} }

// decided marks the fate of cmd's key decided: it is no longer held. It
// is called right before the transaction's end (commit or rollback) or
// the lease's release, and once the lease's outcome is stored.
func (cmd *command) decided() { cmd.held.state = holdNone }

// holdGuard is deferred by the function that holds cmd's key, claimed in
// tx (ModeTx; ex nil) or under the lease token (ModeLease; ex its
// executor). A key still held when it runs means a panic unwinds: undoHeld
// rolls tx back, or releases the lease, at once; the outcome (when the
// handler ran) is reported not stored, as for a handler that panics, and
// the panic goes on. It then restores cmd.r and ends the execute span of
// enter, with the panic as its error (untraced, a panic goes on
// untouched).
func (m *Middleware[TTx]) holdGuard(cmd *command, tx TTx, ex driver.RecordExecutor, token string) {
	h := &cmd.held
	if h.state != holdNone {
		m.undoHeld(cmd, tx, ex, token)
	}
	if h.orig != nil {
		cmd.r = h.orig
	}
	if h.span == nil || h.span == observe.NoopSpan {
		return // untraced: a panic goes on untouched
	}
	s := h.span
	h.span = nil // ended: traceFailure no longer records on it
	endPanicking(s, recover())
}

// undoHeld undoes the claim of cmd's key for holdGuard, while a panic
// unwinds. The driver (Rollback, RecordRelease) and Config.OnOutcome may
// panic in turn: then the deferred call restores cmd.r and ends the
// execute span with that panic as its error, and lets it go on (holdGuard
// does not get to end the span). Only the panic path pays for the defer.
func (m *Middleware[TTx]) undoHeld(cmd *command, tx TTx, ex driver.RecordExecutor, token string) {
	h := &cmd.held
	ran := h.state == holdRan
	h.state = holdNone
	defer func() {
		// Non-nil only when the undo itself panicked: a call deferred here
		// cannot recover the panic that holdGuard unwinds for.
		if p := recover(); p != nil {
			if h.orig != nil {
				cmd.r = h.orig
			}
			if h.span != nil && h.span != observe.NoopSpan {
				endPanicking(h.span, p)
			}
			panic(p)
		}
	}()
	if ex != nil {
		if h.stop != nil {
			h.stop()
		}
		m.release(context.WithoutCancel(cmd.r.Context()), ex, cmd, token)
	} else {
		m.rollback(cmd.r.Context(), tx)
	}
	if ran {
		m.reportCmd(cmd, OutcomeNotStored)
	}
}
