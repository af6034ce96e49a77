package saga

import (
	"time"

	"github.com/idemkit/idem/driver"
)

// State is the state of a saga.
//
//	running ──CompleteTx──> completed
//	   │
//	 AbortTx / Compensate
//	   v
//	compensating ──all compensations recorded──> compensated
//	   │      ^
//	   │      │ Compensate / Resume
//	   v      │
//	 failed ──┘  (a compensation kept failing, or had no entry in the map)
type State string

// The states of a saga.
const (
	// Running: forward steps may run. A saga starts running.
	Running State = driver.SagaRunning
	// Completed: the saga finished its course (CompleteTx). Final.
	Completed State = driver.SagaCompleted
	// Compensating: a forward step failed for good; forward steps are
	// refused and compensations run.
	Compensating State = driver.SagaCompensating
	// Compensated: every completed forward step was compensated. Final.
	Compensated State = driver.SagaCompensated
	// Failed: a compensation kept failing (a *CompensationError, never
	// for a failure of the database, which leaves the saga Compensating,
	// but for a statement of the compensation that keeps timing out), or a
	// completed forward step had no entry in the Compensations map
	// (ErrNoCompensation). Compensate (or Resume) resumes with it; nothing
	// done so far is repeated.
	Failed State = driver.SagaFailed
)

// Finished reports whether s is final (Completed or Compensated).
func (s State) Finished() bool { return driver.SagaFinished(string(s)) }

// Saga is a saga as stored: its state and the steps it completed. It is read
// from the database by Get and Resume; nothing about a saga lives in memory
// between calls.
type Saga struct {
	ID   string
	Type string
	// State is the saga's state when it was read.
	State State
	// Data is the input given to StartTx (the first StartTx's, if it was
	// called several times).
	Data      []byte
	CreatedAt time.Time
	UpdatedAt time.Time
	// FinishedAt is when the saga became Completed or Compensated; zero
	// otherwise.
	FinishedAt time.Time
	// Steps are the recorded steps, forward and compensation, in the order
	// they were recorded. Nil in the result of StartTx.
	Steps []StepRecord
}

// StepRecord is one completed step.
type StepRecord struct {
	// Name is the step name; a compensation's is CompensationPrefix + the
	// forward step's name.
	Name string
	// Compensation is true for a compensation step.
	Compensation bool
	// Seq orders the steps of the saga by the time they were recorded.
	Seq int64
	// Result is what the step's function returned.
	Result []byte
	// CompletedAt is when the step was recorded (Config.Now), taken before
	// its function ran: the step's start, not its end.
	CompletedAt time.Time
}

// Step returns the recorded step name, and false if it did not complete.
func (s *Saga) Step(name string) (StepRecord, bool) {
	for _, st := range s.Steps {
		if st.Name == name {
			return st, true
		}
	}
	return StepRecord{}, false
}

// Done reports whether the step name completed.
func (s *Saga) Done(name string) bool {
	_, ok := s.Step(name)
	return ok
}

// Compensated reports whether the forward step name was compensated.
func (s *Saga) Compensated(name string) bool { return s.Done(CompensationName(name)) }

func fromDriver(s *driver.Saga, steps []driver.SagaStep) *Saga {
	out := &Saga{
		ID:         s.ID,
		Type:       s.Type,
		State:      State(s.State),
		Data:       s.Data,
		CreatedAt:  s.CreatedAt,
		UpdatedAt:  s.UpdatedAt,
		FinishedAt: s.FinishedAt,
	}
	if steps != nil {
		out.Steps = make([]StepRecord, len(steps))
		for i, st := range steps {
			out.Steps[i] = StepRecord{
				Name:         st.Name,
				Compensation: st.Kind == driver.StepCompensation,
				Seq:          st.Seq,
				Result:       st.Result,
				CompletedAt:  st.CompletedAt,
			}
		}
	}
	return out
}
