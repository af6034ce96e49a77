package saga

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrNotFound: no saga has the ID. Start (StartTx) a saga before running its
	// steps.
	ErrNotFound = errors.New("saga: no such saga")
	// ErrState is matched (errors.Is) by every *StateError.
	ErrState = errors.New("saga: the saga's state does not allow this")
	// ErrTypeMismatch: StartTx found a saga with the same ID and another
	// type.
	ErrTypeMismatch = errors.New("saga: the saga exists with another type")
	// ErrInvalidName: a saga ID, type or step name is empty, too long, not
	// valid UTF-8, contains a control character, or a forward step name
	// starts with CompensationPrefix.
	ErrInvalidName = errors.New("saga: invalid name")
	// ErrNoCompensation: Compensate found a completed forward step that the
	// Compensations map has no entry for. Map a step that needs no undoing
	// to nil.
	ErrNoCompensation = errors.New("saga: no compensation for a completed step")
	// ErrEmitConflict: a step's function emitted two different events
	// (another type, key or payload) under one name. They would share one
	// event ID and the outbox would keep only the first: give each event
	// of a step its own name.
	ErrEmitConflict = errors.New("saga: two different events emitted under one name")
)

// StateError reports that a saga is not in a state that allows an
// operation: a forward step of a saga that is compensating, CompleteTx of a
// compensated saga, Compensate of a completed one. It matches ErrState.
//
// A consumer that gets a StateError from Step for a redelivered or late
// event of a saga that is no longer running should roll its transaction back
// and acknowledge the event: the saga has moved on and the step must not
// run.
type StateError struct {
	SagaID string
	// Op is what was refused: "step " + the step's name (a forward step,
	// or a compensation's CompensationName), "complete", "abort" or
	// "compensate".
	Op string
	// State is the state the saga was in.
	State State
	// Want lists the states that would have allowed Op.
	Want []State
}

func (e *StateError) Error() string {
	want := make([]string, len(e.Want))
	for i, s := range e.Want {
		want[i] = string(s)
	}
	return fmt.Sprintf("saga %q: %s refused: the saga is %s, want %s", e.SagaID, e.Op, e.State, strings.Join(want, " or "))
}

// Is reports whether target is ErrState.
func (e *StateError) Is(target error) bool { return target == ErrState }

// StepError is the error of a step's (or a compensation's) function. The
// step was not recorded: StepTx rolled back to a savepoint taken before the
// step (its record and the function's writes are gone, the caller's
// transaction is usable, and the caller may roll it back or abort the saga
// in it and commit); Step and Compensate rolled their own transaction
// back. A retry runs the function again, and the step is never
// compensated.
type StepError struct {
	SagaID string
	Step   string
	Err    error
}

func (e *StepError) Error() string {
	return fmt.Sprintf("saga %q: step %q failed: %v", e.SagaID, e.Step, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// CompensationError reports that Compensate stopped because the compensation
// of Step kept failing (Config.CompensationAttempts times). The saga is then
// in state Failed, its earlier compensations stay recorded, and the next
// Compensate (or Resume) resumes with this one. A failure of the database
// never gives one, except a statement of the compensation cancelled by
// statement_timeout or lock_timeout each time (see Compensate).
type CompensationError struct {
	SagaID string
	// Step is the forward step whose compensation failed.
	Step     string
	Attempts int
	// Err is the last attempt's error.
	Err error
}

func (e *CompensationError) Error() string {
	return fmt.Sprintf("saga %q: compensation of step %q failed %d times: %v", e.SagaID, e.Step, e.Attempts, e.Err)
}

func (e *CompensationError) Unwrap() error { return e.Err }
