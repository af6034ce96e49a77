package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem/driver"
)

// serveTx runs cmd in transaction-bound mode: BEGIN; claim; handler; store
// response; COMMIT. A concurrent duplicate blocks on the claim's unique index
// until the first transaction ends (bounded by Config.Wait), then replays its
// committed record, or executes if the first one rolled back.
func (m *Middleware[TTx]) serveTx(cmd *command, next http.Handler) {
	if tc, ok := any(m.drv).(driver.TxClaimer[TTx]); ok {
		m.serveTxClaim(tc, cmd, next)
		return
	}
	ctx := cmd.r.Context()
	for polls := 0; ; polls++ {
		tx, err := m.drv.Begin(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.storeUnavailable(cmd, err)
			}
			return
		}
		if m.claimTx(cmd, next, tx) {
			return
		}
		// In progress under a lease: a ModeLease middleware shares the scope.
		if m.waitLeft(cmd) <= 0 {
			m.inProgress(cmd)
			return
		}
		if pause(ctx, pollDelay(polls)) != nil {
			return
		}
	}
}

// claimTx claims cmd's key in tx, just begun, and executes the command in
// it when claimed. It holds tx (holdGuard) until tx ends. It returns false
// when the key is in progress under a lease (tx rolled back, nothing
// answered): the caller polls.
func (m *Middleware[TTx]) claimTx(cmd *command, next http.Handler, tx TTx) (answered bool) {
	ctx := cmd.r.Context()
	cmd.hold()
	defer m.holdGuard(cmd, tx, nil, "") // also when the handler or a hook panics
	ex := m.drv.RecordsTx(tx)
	p := m.claimParams(cmd, m.lockTimeout(cmd))
	span := m.span(cmd, "idem.http.claim")
	res, err := ex.RecordClaim(ctx, p)
	m.endClaim(span, err == nil && res.Claimed, err)
	if err != nil {
		m.rollbackHeld(ctx, cmd, tx)
		switch {
		case errors.Is(err, driver.ErrLockTimeout):
			m.inProgress(cmd)
		case ctx.Err() == nil:
			m.storeUnavailable(cmd, err)
		}
		return true
	}
	if res.Claimed {
		if ctx.Err() != nil {
			// The request ended as the key was claimed (a duplicate whose
			// wait ended as the holder rolled back): the handler does
			// not run on a dead context. Answered by the caller.
			m.rollbackHeld(ctx, cmd, tx)
			return true
		}
		cmd.held.span, cmd.held.orig = m.enter(cmd, "idem.http.execute")
		m.executeTx(cmd, next, tx, ex, p.LeaseToken)
		return true
	}
	m.rollbackHeld(ctx, cmd, tx)
	return m.answerExisting(cmd, res.Existing)
}

// executeTx runs the handler in tx and commits its writes with the stored
// response, or rolls everything back.
func (m *Middleware[TTx]) executeTx(cmd *command, next http.Handler, tx TTx, ex driver.RecordExecutor, token string) {
	ctx := cmd.r.Context()
	rec := m.runInTx(cmd, next, tx)
	if rec == nil {
		return
	}
	// The record's write and the COMMIT are bounded together
	// (CommitTimeout), and run on when the client has gone.
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CommitTimeout)
	defer cancel()
	if err := m.complete(bg, ex, cmd, token, rec); err != nil {
		err = m.commitTimedOut(bg, err)
		m.rollbackHeld(ctx, cmd, tx)
		if !m.handlerTxFailed(cmd, err) && !m.idleTimedOut(cmd, err) {
			m.storeUnavailable(cmd, err) // nothing committed: no COMMIT was sent
		}
		return
	}
	cmd.decided()
	if err := m.drv.Commit(bg, tx); err != nil {
		err = m.commitTimedOut(bg, err)
		m.rollback(ctx, tx)
		switch {
		case m.handlerTxFailed(cmd, err), m.idleTimedOut(cmd, err), m.roleRefused(cmd, err):
		case errors.Is(err, driver.ErrNotCommitted):
			m.storeUnavailable(cmd, err) // the server refused the COMMIT: rolled back
		default:
			m.outcomeUnknown(cmd, err)
		}
		return
	}
	m.rememberCompleted(cmd) // committed: the replay cache may answer retries
	rec.flush(cmd.w)
	m.reportCmd(cmd, OutcomeExecuted)
}

// runInTx runs the handler with tx in its context and returns its recorded
// response when it is to be stored, tx still open and held. Otherwise (a
// client gone, a response too large or not storable) it rolls tx back,
// answers and reports, and returns nil. A panic of the handler, or of
// Config.Store (asked with tx open), leaves tx held: the caller's
// holdGuard rolls it back and lets the panic go on. A handler
// that had ended tx itself gets 500 transaction-ended, as when its response
// is to be stored: its failure, passed on, would be retried, and the retry
// would execute again what its COMMIT may have committed.
func (m *Middleware[TTx]) runInTx(cmd *command, next http.Handler, tx TTx) *recorder {
	ctx := cmd.r.Context()
	rec := newRecorder(m.cfg.MaxResponseBytes)
	hctx := context.WithValue(context.WithValue(ctx, txKey{}, tx), keyKey{}, cmd.key)
	cmd.held.state = holdRan
	next.ServeHTTP(rec, cmd.request(hctx))
	rec.seal()

	// Store is asked once, with tx open (a panic of it rolls back too).
	store := ctx.Err() == nil && m.cfg.Store(rec.statusCode())
	if store && !rec.overflow {
		return rec
	}
	// Not stored: undo. The transaction found ended while the request's
	// context is live was ended by the handler (database/sql also ends it
	// when that context ends: then it cannot be told apart).
	cmd.decided()
	err := m.rollbackEnded(ctx, tx)
	if err != nil && ctx.Err() == nil {
		m.handlerTxFailed(cmd, fmt.Errorf("idemhttp: the handler answered %d: %w", rec.statusCode(), err))
		return nil
	}
	switch {
	case ctx.Err() != nil: // the client is gone, or its deadline passed: nothing happened
		m.requestEnded(cmd) // not net/http's empty 200
	case !store: // ctx was live when store was decided too
		m.passNotStored(cmd, rec)
	default: // too large to store
		m.writeTooLarge(cmd.w, cmd, "The command was rolled back because its response could not be stored for replay.")
	}
	m.reportCmd(cmd, OutcomeNotStored)
	return nil
}

// commitTimedOut returns err, the error of a store call on ctx (bounded
// by CommitTimeout), saying so when that bound passed.
func (m *Middleware[TTx]) commitTimedOut(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("idemhttp: the store did not answer within CommitTimeout (%s): %w", m.cfg.CommitTimeout, err)
	}
	return err
}

// rollbackHeld rolls back tx, held by cmd: its fate is decided.
func (m *Middleware[TTx]) rollbackHeld(ctx context.Context, cmd *command, tx TTx) {
	cmd.decided()
	m.rollback(ctx, tx)
}

func (m *Middleware[TTx]) rollback(ctx context.Context, tx TTx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := m.drv.Rollback(ctx, tx); err != nil {
		m.cfg.Logger.WarnContext(ctx, "idemhttp: rollback failed", "err", err)
	}
}

// rollbackEnded rolls tx back as rollback does. When the driver is a
// driver.EndedRollbacker that found tx already ended, it returns that
// error (driver.ErrTxDone); otherwise nil.
func (m *Middleware[TTx]) rollbackEnded(ctx context.Context, tx TTx) error {
	er, ok := any(m.drv).(driver.EndedRollbacker[TTx])
	if !ok {
		m.rollback(ctx, tx)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := er.RollbackEnded(ctx, tx)
	if errors.Is(err, driver.ErrTxDone) {
		return err
	}
	if err != nil {
		m.cfg.Logger.WarnContext(ctx, "idemhttp: rollback failed", "err", err)
	}
	return nil
}
