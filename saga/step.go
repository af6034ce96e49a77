package saga

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/txnil"
	"github.com/idemkit/idem/observe"
)

// StepFunc is the effect of a step. It writes through tx, the transaction in
// which the step is recorded, and returns the step's result (what later
// steps and the step's compensation need: a reservation ID, a charge ID), or
// nil.
//
// It may start more than once before the step is recorded: an attempt that
// failed (an error, a panic) or whose transaction rolled back (a failed
// COMMIT, a crash before it) runs again at the next delivery. Effects
// outside tx (an HTTP charge) must therefore be idempotent themselves,
// keyed for example by EventID(sagaID, stepName, "charge"). Whatever it
// wrote through tx before failing is undone, a call of AbortTx with tx
// included: abort the saga after StepTx returned the *StepError.
type StepFunc[TTx any] func(ctx context.Context, tx TTx) (result []byte, err error)

// StepTx runs the forward step stepName of saga sagaID once, in the caller's
// transaction tx: it records the step (sagaID, stepName) and, if it was not
// recorded before, calls fn with tx and stores fn's result with the record.
// The record and fn's writes commit together when the caller commits tx,
// or vanish together if tx rolls back.
//
// It returns ran true when fn ran now, and (the recorded result, false, nil)
// when the step had completed before (a retried or redelivered step): fn is
// not called and nothing is written.
//
// A step of a saga that is not Running gives a *StateError (unless the step
// had completed: then its result is returned as above); a saga that was not
// started gives ErrNotFound.
//
// The record and fn run in a savepoint of tx. If fn fails, or panics,
// StepTx rolls back to that savepoint: neither the step's record nor
// anything fn wrote through tx stays in tx, which stays usable (on
// PostgreSQL even when a statement of fn failed and aborted it). It then
// returns a *StepError wrapping fn's error (a panic goes on). The caller may
// roll tx back, or abort the saga in it (AbortTx) and commit; the failed
// step is not compensated, and a retry, in tx or later, runs fn again.
// After any other error the caller must roll tx back. The rollback to the
// savepoint runs even when ctx has ended, for 5s at most: if it fails or
// takes longer (a connection that stopped answering), StepTx returns
// fn's error joined with the rollback's, not a *StepError.
//
// The savepoint is one subtransaction of tx per step (PostgreSQL tracks up
// to 64 per transaction cheaply). With pgdriver, SAVEPOINT travels with
// the record's INSERT and RELEASE with the UPDATE of fn's result (a step
// without a result adds one round trip); with pgsqldriver each is a round
// trip of its own; on SQLite they are local. Step and the compensations of
// Compensate run in a transaction of their own, rolled back whole, and need
// none.
//
// A concurrent StepTx of the same step waits for this one's transaction
// (PostgreSQL on the primary key, SQLite for the write lock) and then skips,
// or runs if this one rolled back. While tx is open, PostgreSQL holds a
// share lock on the saga's row, so AbortTx and Compensate wait for the step to
// commit and then compensate it too.
func (c *Coordinator[TTx]) StepTx(ctx context.Context, tx TTx, sagaID, stepName string, fn StepFunc[TTx]) (result []byte, ran bool, err error) {
	if err := checkStep(sagaID, stepName); err != nil {
		return nil, false, err
	}
	if fn == nil {
		return nil, false, fmt.Errorf("saga %q: step %q: nil function", sagaID, stepName)
	}
	if txnil.Is(tx) {
		return nil, false, nilTxError(sagaID, "step "+stepName)
	}
	return c.step(ctx, tx, sagaID, stepName, driver.StepForward, fn, true)
}

// Step is StepTx in a transaction of its own: it begins one, runs StepTx and
// commits, or rolls back on any error (and on a panic of fn, which it lets
// go on). To join the transaction of an inbox.ProcessTx (the event, the
// step and its effect committed together), use StepTx with that
// transaction: Step's own transaction would not see a saga started in it,
// and on SQLite would wait for its write lock.
func (c *Coordinator[TTx]) Step(ctx context.Context, sagaID, stepName string, fn StepFunc[TTx]) (result []byte, ran bool, err error) {
	if err := checkStep(sagaID, stepName); err != nil {
		return nil, false, err
	}
	if fn == nil {
		return nil, false, fmt.Errorf("saga %q: step %q: nil function", sagaID, stepName)
	}
	err = c.inTx(ctx, func(tx TTx) error {
		var err error
		result, ran, err = c.step(ctx, tx, sagaID, stepName, driver.StepForward, fn, false)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return result, ran, nil
}

// step claims (sagaID, name) with one INSERT ... ON CONFLICT DO NOTHING and,
// if the claim is new, runs fn in the same transaction. Claiming before
// running is what makes concurrent duplicates wait instead of both running
// fn.
//
// With savepoint (the caller's transaction, StepTx), the claim and fn run
// in a savepoint, rolled back to when fn fails or panics: the failed step
// leaves nothing in tx. In a transaction of its own (Step, a compensation)
// the whole transaction is rolled back instead, and no savepoint is needed.
func (c *Coordinator[TTx]) step(ctx context.Context, tx TTx, sagaID, name, kind string, fn StepFunc[TTx], savepoint bool) (result []byte, ran bool, err error) {
	if c.cfg.Tracer != nil {
		var span observe.Span
		ctx, span = c.cfg.Tracer.Start(ctx, "idem.saga.step", observe.String("idem.saga.step", name), observe.String("idem.saga.step_kind", kind))
		defer func() {
			span.SetAttributes(observe.Bool("idem.saga.ran", ran))
			// A panicking step ends its span failed, and panics on.
			if p := recover(); p != nil {
				observe.End(span, fmt.Errorf("panic: %v", p))
				panic(p)
			}
			observe.End(span, err)
		}()
	}
	ex := c.drv.SagasTx(tx)
	inserted, existing, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: sagaID, Step: name, Kind: kind, Result: nil, Now: c.cfg.Now(), Savepoint: savepoint})
	if err != nil {
		return nil, false, wrapErr(sagaID, "step "+name, err)
	}
	if !inserted {
		return existing, false, nil
	}
	if savepoint {
		return c.stepInSavepoint(ctx, tx, ex, sagaID, name, fn)
	}
	result, err = fn(withEmits(ctx, sagaID, name), tx)
	if err != nil {
		return nil, false, &StepError{SagaID: sagaID, Step: name, Err: err}
	}
	if result != nil {
		if err := ex.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: sagaID, Step: name, Result: result}); err != nil {
			return nil, false, wrapErr(sagaID, "step "+name, err)
		}
	}
	return result, true, nil
}

// stepInSavepoint runs fn for the step that SagaStepRecord just recorded in
// a savepoint, and ends the savepoint: released with fn's result, or rolled
// back to when fn fails or panics (the panic goes on).
func (c *Coordinator[TTx]) stepInSavepoint(ctx context.Context, tx TTx, ex driver.SagaExecutor, sagaID, name string, fn StepFunc[TTx]) (result []byte, ran bool, err error) {
	// The rollback must run even when ctx has ended: the caller decides
	// what happens to tx, and the step must not stay recorded in it. It is
	// bounded all the same: on a connection that stopped answering it
	// would otherwise wait for ever (until TCP gives up), with nothing left
	// to cancel it; StepTx then reports the undo's failure (roll back).
	rollback := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		defer cancel()
		return ex.SagaStepEnd(ctx, &driver.SagaStepEndParams{SagaID: sagaID, Step: name, Failed: true})
	}
	done := false
	defer func() {
		if !done {
			_ = rollback() // fn panicked
		}
	}()
	result, err = fn(withEmits(ctx, sagaID, name), tx)
	done = true
	if err != nil {
		if rbErr := rollback(); rbErr != nil {
			// The step may still be recorded in tx: not a StepError, which
			// says it is not; the caller must roll tx back.
			return nil, false, fmt.Errorf("saga %q: step %q failed: %w; and undoing its record failed (roll the transaction back): %w", sagaID, name, err, rbErr)
		}
		return nil, false, &StepError{SagaID: sagaID, Step: name, Err: err}
	}
	if err := ex.SagaStepEnd(ctx, &driver.SagaStepEndParams{SagaID: sagaID, Step: name, Result: result}); err != nil {
		return nil, false, wrapErr(sagaID, "step "+name, err)
	}
	return result, true, nil
}

// inTx runs fn in a new transaction and commits it, or rolls it back when fn
// fails or panics.
func (c *Coordinator[TTx]) inTx(ctx context.Context, fn func(tx TTx) error) (err error) {
	tx, err := c.drv.Begin(ctx)
	if err != nil {
		return fmt.Errorf("saga: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			c.rollback(ctx, tx)
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := c.drv.Commit(ctx, tx); err != nil {
		return fmt.Errorf("saga: %w", err)
	}
	committed = true
	return nil
}
