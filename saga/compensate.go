package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/dberr"
)

// CompensationFunc undoes the forward step forward (whose Result is what the
// step returned), writing through tx, the transaction in which the
// compensation is recorded. It returns the compensation's result, or nil.
//
// A compensation runs at most once to completion, but may start several
// times: an attempt whose transaction rolled back (an error, a crash before
// COMMIT) is retried. Effects outside tx (an HTTP refund) must therefore be
// idempotent themselves, keyed for example by EventID(sagaID,
// CompensationName(forward.Name), "").
type CompensationFunc[TTx any] func(ctx context.Context, tx TTx, forward StepRecord) (result []byte, err error)

// Compensations maps a forward step name to its compensation. A step that
// needs no undoing (a validation, a read) maps to nil: its compensation is
// recorded as done without running anything.
type Compensations[TTx any] map[string]CompensationFunc[TTx]

// Compensate undoes the saga sagaID: it marks it Compensating (forward steps
// are refused from then on), then runs the compensation of every completed
// forward step, in reverse order of completion, each as an idempotent step
// named CompensationName(step) in a transaction of its own, and finally
// marks the saga Compensated. A step that never completed (the one that
// failed, and those after it) is never compensated.
//
// It is safe to call again, concurrently too, and after a crash: a
// compensation that is recorded is never run again, so a retried Compensate
// resumes with the first compensation that is not. A compensation that fails
// is retried (Config.CompensationAttempts, with backoff); if it keeps
// failing, Compensate marks the saga Failed and returns a
// *CompensationError, and the next call resumes with it.
//
// A failure of the database is not a failed attempt, even when the
// compensation's own statements get it: a passing one (dberr.Transient: a
// connection lost to a failover or pg_terminate_backend, a serialization
// failure or deadlock, a read-only database, a full disk, a lock or
// statement timeout of idem's own statements) or one an operator fixes (a
// privilege or login refused, driver.ErrNotMigrated). Compensate returns
// it at once, the saga stays Compensating (List finds it) and the next
// Compensate or Resume, once the database is back, resumes with that
// compensation: call it again later, as a recovery loop over
// List(Compensating, Failed) or a redelivered event does.
//
// A statement of the compensation's function cancelled by statement_timeout
// (57014) or lock_timeout (55P03) is a failed attempt all the same: a
// statement that always runs longer than the limit, or waits for a lock
// never released, would otherwise leave the saga Compensating for ever,
// retried by every recovery round and never Failed. After
// CompensationAttempts of them the saga is Failed with a
// *CompensationError, where a recovery loop still retries it and an alert
// on Failed sagas sees it.
//
// A compensation that panics is not retried: its transaction rolls back,
// the panic goes on, and the saga stays Compensating with the compensations
// done so far recorded; the next Compensate (or Resume) resumes with it.
//
// Compensating a Compensated saga is a no-op. A Completed saga gives a
// *StateError; a completed forward step missing from comps gives
// ErrNoCompensation (the saga is then marked Failed).
//
// Compensate runs its own transactions: never call it while holding a
// transaction that touched the saga (a step recorded, the saga started or
// aborted in it) or, on SQLite, any transaction of the same database. It
// would wait for that transaction's locks, which only the caller, blocked
// in Compensate, can release: on PostgreSQL until ctx ends, a deadlock the
// server cannot see. From an event consumer, call AbortTx in the consumer's
// transaction and Compensate after it committed. Called with the context
// of a step's or a compensation's function of the same saga, Compensate
// refuses at once with an error and changes nothing (so does Resume when
// it would compensate).
func (c *Coordinator[TTx]) Compensate(ctx context.Context, sagaID string, comps Compensations[TTx]) error {
	if err := checkName("saga ID", sagaID); err != nil {
		return err
	}
	if e, ok := ctx.Value(emitsKey{}).(*emits); ok && e.sagaID == sagaID {
		// It would wait for the transaction of that function, which
		// cannot end before Compensate returns.
		return fmt.Errorf("saga %q: compensate: called from inside the function of step %q of the same saga: call AbortTx in the step's transaction and Compensate after its commit", sagaID, e.step)
	}
	ex := c.drv.Sagas()
	// On PostgreSQL this waits for the forward steps being recorded right
	// now, so the steps read below include them.
	changed, cur, err := ex.SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: sagaID, From: states([]State{Running, Compensating, Failed}), To: string(Compensating), Now: c.cfg.Now()})
	if err != nil {
		return wrapErr(sagaID, "compensate", err)
	}
	if !changed {
		if State(cur) == Compensated {
			return nil
		}
		return &StateError{SagaID: sagaID, Op: "compensate", State: State(cur), Want: []State{Running, Compensating, Failed}}
	}
	steps, err := ex.SagaSteps(ctx, &driver.SagaStepsParams{SagaID: sagaID})
	if err != nil {
		return wrapErr(sagaID, "compensate", err)
	}
	s := fromDriver(&driver.Saga{ID: sagaID}, steps)

	var todo []StepRecord // completed forward steps not compensated yet, last first
	for i := len(s.Steps) - 1; i >= 0; i-- {
		st := s.Steps[i]
		if st.Compensation || s.Compensated(st.Name) {
			continue
		}
		if _, ok := comps[st.Name]; !ok {
			err := fmt.Errorf("saga %q: step %q: %w", sagaID, st.Name, ErrNoCompensation)
			c.markFailed(ctx, sagaID, err)
			return err
		}
		todo = append(todo, st)
	}
	for _, st := range todo {
		if err := c.compensateStep(ctx, sagaID, st, comps[st.Name]); err != nil {
			return err
		}
	}
	changed, cur, err = ex.SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: sagaID, From: states([]State{Compensating}), To: string(Compensated), Now: c.cfg.Now()})
	if err != nil {
		return wrapErr(sagaID, "compensate", err)
	}
	if !changed && State(cur) != Compensated {
		// A concurrent Compensate gave up (Failed) meanwhile.
		return &StateError{SagaID: sagaID, Op: "compensate", State: State(cur), Want: []State{Compensating}}
	}
	return nil
}

// maxCompensationBackoff caps the wait between attempts of a compensation
// (Config.CompensationBackoff doubles after each).
const maxCompensationBackoff = 30 * time.Second

// compensateStep runs the compensation of forward until it is recorded,
// making up to Config.CompensationAttempts attempts.
func (c *Coordinator[TTx]) compensateStep(ctx context.Context, sagaID string, forward StepRecord, fn CompensationFunc[TTx]) error {
	name := CompensationName(forward.Name)
	run := func(ctx context.Context, tx TTx) ([]byte, error) {
		if fn == nil {
			return nil, nil
		}
		return fn(ctx, tx, forward)
	}
	backoff := c.cfg.CompensationBackoff
	var err error
	for attempt := 1; ; attempt++ {
		err = c.inTx(ctx, func(tx TTx) error {
			_, _, err := c.step(ctx, tx, sagaID, name, driver.StepCompensation, run, false)
			return err
		})
		if err == nil {
			return nil
		}
		var stepErr *StepError
		if !errors.As(err, &stepErr) && (errors.Is(err, ErrState) || errors.Is(err, ErrNotFound)) {
			// Another Compensate marked the saga Failed, or the saga is
			// gone: this call has nothing more to do. (An error of the
			// compensation itself, a *StepError, is a failed attempt even
			// when it wraps one of these.)
			return err
		}
		if ctx.Err() != nil {
			// Shutting down: the saga stays Compensating; the next call
			// resumes here.
			return fmt.Errorf("saga %q: compensate step %q: %w", sagaID, forward.Name, ctx.Err())
		}
		if dberr.Fault(err) && (stepErr == nil || !dberr.Timeout(stepErr.Err)) {
			// The database failed, not the compensation (even inside
			// it, a *StepError): not an attempt. The saga stays
			// Compensating; the next call resumes here. A timeout of
			// the compensation's own statement is an attempt: one that
			// always runs out would otherwise stay Compensating for
			// ever, retried by every recovery round, never Failed.
			return fmt.Errorf("saga %q: compensate step %q: not attempted again, the database failed (the saga stays compensating): %w", sagaID, forward.Name, err)
		}
		c.cfg.Logger.Warn("saga: compensation failed", "saga", sagaID, "step", forward.Name, "attempt", attempt, "err", err)
		if attempt >= c.cfg.CompensationAttempts {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("saga %q: compensate step %q: %w", sagaID, forward.Name, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxCompensationBackoff)
	}
	cerr := &CompensationError{SagaID: sagaID, Step: forward.Name, Attempts: c.cfg.CompensationAttempts, Err: err}
	c.markFailed(ctx, sagaID, cerr)
	return cerr
}

// markFailed moves a compensating saga to Failed, so that List finds it.
func (c *Coordinator[TTx]) markFailed(ctx context.Context, sagaID string, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	_, _, err := c.drv.Sagas().SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: sagaID, From: states([]State{Compensating}), To: string(Failed), Now: c.cfg.Now()})
	if err != nil {
		c.cfg.Logger.Warn("saga: could not mark the saga failed", "saga", sagaID, "cause", cause, "err", err)
	}
}

// Resume reads the saga and, if a compensation of it was interrupted (it is
// Compensating or Failed), finishes it with comps first. It returns the
// saga as it stands afterwards, with the error of Compensate if that failed.
//
// A Running saga is returned as it is: its next step runs when the event
// that drives it is consumed (or redelivered after a crash); Saga.Done tells
// which steps completed.
func (c *Coordinator[TTx]) Resume(ctx context.Context, sagaID string, comps Compensations[TTx]) (*Saga, error) {
	s, err := c.Get(ctx, sagaID)
	if err != nil {
		return nil, err
	}
	if s.State != Compensating && s.State != Failed {
		return s, nil
	}
	cerr := c.Compensate(ctx, sagaID, comps)
	s, err = c.Get(ctx, sagaID)
	if err != nil {
		return nil, errors.Join(cerr, err)
	}
	return s, cerr
}
