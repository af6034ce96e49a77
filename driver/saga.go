package driver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Saga states (column saga.state).
const (
	// SagaRunning: forward steps may run.
	SagaRunning = "running"
	// SagaCompleted: every forward step ran; the saga is finished.
	SagaCompleted = "completed"
	// SagaCompensating: a forward step failed for good; compensations run.
	SagaCompensating = "compensating"
	// SagaCompensated: every completed forward step was compensated; the
	// saga is finished.
	SagaCompensated = "compensated"
	// SagaFailed: a compensation kept failing, or a completed step had
	// none; compensating the saga again resumes where it stopped.
	SagaFailed = "failed"
)

// Kinds of saga steps (column saga_step.kind).
const (
	// StepForward is a step of the saga's normal course.
	StepForward = "forward"
	// StepCompensation undoes a completed forward step.
	StepCompensation = "compensation"
)

// ErrSagaState is returned (wrapped in a *SagaStateError) when a saga is not
// in the state an operation requires.
var ErrSagaState = errors.New("idem/driver: saga state does not allow this")

// SagaStateError reports the state a saga was in when an operation that
// required another state was refused. It matches ErrSagaState with
// errors.Is.
type SagaStateError struct {
	SagaID string
	// State is the saga's current state.
	State string
	// Want lists the states the operation required.
	Want []string
}

func (e *SagaStateError) Error() string {
	return fmt.Sprintf("idem/driver: saga %q is %s, want %v", e.SagaID, e.State, e.Want)
}

// Is reports whether target is ErrSagaState.
func (e *SagaStateError) Is(target error) bool { return target == ErrSagaState }

// Saga is one stored saga (table saga).
type Saga struct {
	ID    string
	Type  string
	State string
	// Data is the saga's input, opaque to idem (the application's JSON).
	// It is written once, by SagaCreate.
	Data      []byte
	CreatedAt time.Time
	UpdatedAt time.Time
	// FinishedAt is set when the saga reached SagaCompleted or
	// SagaCompensated; zero otherwise.
	FinishedAt time.Time
}

// SagaStep is one completed step of a saga (table saga_step).
type SagaStep struct {
	SagaID string
	Name   string
	// Kind is StepForward or StepCompensation.
	Kind string
	// Seq orders the steps of a saga by the time they were recorded: a
	// step recorded after another has a greater Seq. Values are not
	// contiguous and not comparable across sagas.
	Seq         int64
	Result      []byte
	CompletedAt time.Time
}

// SagaExecutor is the storage of sagas (tables saga and saga_step). See
// package saga for the code that uses it.
//
// A row (saga_id, step_name) of saga_step says that the step completed: it
// is written in the transaction of the step's effect, so both commit or
// neither does (rule R-DIST-IDEM-1: a saga step is identified by sagaId +
// stepName).
type SagaExecutor interface {
	// SagaCreate inserts s if no saga has its ID (INSERT ... ON CONFLICT DO
	// NOTHING) and returns the stored saga: s itself with created true, or
	// the existing saga, unchanged, with created false. On a backend with
	// concurrent writers, a create of an ID that an uncommitted transaction
	// created waits for that transaction.
	SagaCreate(ctx context.Context, s *Saga) (stored *Saga, created bool, err error)

	// SagaGet returns the saga p.SagaID, or ErrNotFound.
	SagaGet(ctx context.Context, p *SagaGetParams) (*Saga, error)

	// SagaSetState moves the saga p.SagaID to state p.To at p.Now, in one
	// UPDATE guarded by the expected states p.From: it changes the saga
	// only when its state is one of them. updated_at becomes p.Now;
	// finished_at becomes p.Now when p.To is SagaCompleted or
	// SagaCompensated, and NULL otherwise. It returns changed true and
	// current == p.To when it moved the saga, and
	// changed false with the saga's current state when the guard refused.
	// ErrNotFound when there is no such saga.
	//
	// On a backend with concurrent writers the UPDATE waits for the
	// transactions that are recording a step of the saga (see
	// SagaStepRecord), so no step of the old state commits after the state
	// changed.
	SagaSetState(ctx context.Context, p *SagaSetStateParams) (changed bool, current string, err error)

	// SagaStepRecord records that step p.Step of saga p.SagaID, of kind
	// p.Kind, completed at p.Now with p.Result, with INSERT ... SELECT ...
	// ON CONFLICT DO NOTHING RETURNING (no SELECT of the step before it),
	// and returns inserted true when the row is new: the caller must now
	// perform the step's effect in the same transaction. When the step is
	// already recorded it returns inserted false and the stored result,
	// whatever the saga's state.
	//
	// A new row is only kept while the saga is in the state its kind
	// requires: SagaRunning for StepForward, SagaCompensating for
	// StepCompensation; otherwise a *SagaStateError, and nothing is
	// recorded. ErrNotFound when there is no such saga. On a backend with
	// concurrent writers, a step that an uncommitted transaction recorded
	// makes it wait for that transaction, holding no lock on the saga's
	// row meanwhile (so that transaction may still change the saga's
	// state, as the last step's does): then it reports the step as
	// existing if that transaction committed, or inserts it if it rolled
	// back. A step it inserted then share-locks the saga's row until the
	// transaction ends (so that SagaSetState waits for it), waiting for an
	// uncommitted state change, and is refused (its insert undone) if the
	// saga's state changed meanwhile; a step found recorded locks nothing.
	SagaStepRecord(ctx context.Context, p *SagaStepRecordParams) (inserted bool, existingResult []byte, err error)

	// SagaStepSetResult replaces the result of a recorded step with p.Result (the step's
	// function ran after SagaStepRecord claimed it, in the same
	// transaction). ErrNotFound if the step is not recorded.
	SagaStepSetResult(ctx context.Context, p *SagaStepSetResultParams) error

	// SagaStepEnd ends the savepoint that SagaStepRecord opened (with
	// p.Savepoint) for the newly inserted step p.Step. When p.Failed, it
	// rolls back to the savepoint and releases it: the step's row and
	// whatever was written since are undone, and the transaction is
	// usable again even if a statement since then failed (PostgreSQL's
	// aborted state). Otherwise it stores p.Result when not nil (as
	// SagaStepSetResult; ErrNotFound if the step is not recorded) and
	// releases the savepoint: the step and the writes since stay in the
	// transaction. Its statements go in one round trip where the backend
	// allows it.
	SagaStepEnd(ctx context.Context, p *SagaStepEndParams) error

	// SagaSteps returns the recorded steps of saga p.SagaID, forward and
	// compensation, ordered by Seq. A saga without steps, or no saga,
	// gives an empty result.
	SagaSteps(ctx context.Context, p *SagaStepsParams) ([]SagaStep, error)

	// SagaList returns at most p.Limit sagas whose state is one of
	// p.States, least recently updated first (for a recovery loop that
	// resumes interrupted compensations). p.Limit must be positive.
	SagaList(ctx context.Context, p *SagaListParams) ([]Saga, error)

	// SagaDeleteFinishedBefore deletes at most p.Limit finished sagas
	// (SagaCompleted or SagaCompensated) whose finished_at is before
	// p.Before, oldest first in (finished_at, saga_id) order from p.After on
	// (see DeleteResult), with their steps, and returns how many sagas it
	// deleted and the last one's key. Running, compensating and failed
	// sagas are never deleted. The cleaner calls it in a loop, each call
	// with the Last of the one before, until it deletes less than p.Limit.
	// p.Limit must be positive.
	SagaDeleteFinishedBefore(ctx context.Context, p *SagaDeleteFinishedBeforeParams) (DeleteResult[SagaCursor], error)
}

// SagaFinished reports whether state is a final state (SagaCompleted or
// SagaCompensated), the states in which finished_at is set.
func SagaFinished(state string) bool {
	return state == SagaCompleted || state == SagaCompensated
}

// SagaStepState returns the saga state in which a new step of kind may be
// recorded, and false for an unknown kind.
func SagaStepState(kind string) (string, bool) {
	switch kind {
	case StepForward:
		return SagaRunning, true
	case StepCompensation:
		return SagaCompensating, true
	}
	return "", false
}

// ValidSagaState reports whether state is one of the five saga states.
func ValidSagaState(state string) bool {
	switch state {
	case SagaRunning, SagaCompleted, SagaCompensating, SagaCompensated, SagaFailed:
		return true
	}
	return false
}
