package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/fixture"

	"github.com/idemkit/idem/driver"
)

// runSaga runs the saga storage tests (tables saga and saga_step) against the
// backend that newDriver builds: SagaCreate inserts once and returns the
// stored saga to later creates, SagaSetState changes only a saga in an
// expected state and keeps finished_at in step with the final states,
// SagaStepRecord records a step once (a duplicate gets the stored result)
// and only in the state its kind requires, SagaStepEnd rolls back to or
// releases the savepoint of a step recorded with Savepoint, a rolled-back
// transaction leaves nothing, concurrent duplicates record a step exactly
// once and, on backends with concurrent writers, a duplicate waits for the
// uncommitted transaction that recorded the step (without holding up that
// transaction's own state change), a state change waits for
// the transactions recording steps and a step waits for an uncommitted
// state change (then is refused, or recorded if it rolled back); SagaSteps
// orders by seq; SagaList filters by state;
// SagaDeleteFinishedBefore deletes only old finished sagas, with their steps,
// at most limit per call.
//
// newDriver has the contract of Run's: a fresh, migrated database per call.
func runSaga[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, drv driver.Driver[TTx])
	}{
		{"Create/InsertsOnce", testSagaCreate[TTx]},
		{"Create/RejectsUnknownState", testSagaCreateBadState[TTx]},
		{"Get/Missing", testSagaGetMissing[TTx]},
		{"SetState/Guard", testSagaSetState[TTx]},
		{"Step/RecordOnce", testSagaStepRecord[TTx]},
		{"Step/RequiresState", testSagaStepState[TTx]},
		{"Step/MissingSaga", testSagaStepMissing[TTx]},
		{"Step/OrderedBySeq", testSagaStepsOrder[TTx]},
		{"RollbackLeavesNothing", testSagaRollback[TTx]},
		{"ConcurrentDuplicatesOneRecord", testSagaConcurrentDuplicates[TTx]},
		{"ConcurrentTx/DuplicateWaitsForCommit", testSagaTxWaitsForCommit[TTx]},
		{"ConcurrentTx/DuplicateRecordsAfterRollback", testSagaTxRecordsAfterRollback[TTx]},
		{"ConcurrentTx/SetStateWaitsForStep", testSagaSetStateWaitsForStep[TTx]},
		{"ConcurrentTx/DuplicateLetsStateChange", testSagaDuplicateLetsStateChange[TTx]},
		{"ConcurrentTx/StepWaitsForStateChange", testSagaStepWaitsForStateChange[TTx]},
		{"Step/Savepoint", testSagaStepSavepoint[TTx]},
		{"List", testSagaList[TTx]},
		{"DeleteFinishedBefore", testSagaDeleteFinished[TTx]},
	}
	t.Run("Saga", func(t *testing.T) {
		t.Parallel()
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				tt.fn(t, newDriver(t))
			})
		}
	})
}

func sagaGet(t *testing.T, ex driver.Executor, id string) *driver.Saga {
	t.Helper()
	s, err := ex.SagaGet(t.Context(), &driver.SagaGetParams{SagaID: id})
	if err != nil {
		t.Fatalf("SagaGet(%q): %v", id, err)
	}
	return s
}

func sagaStepNames(steps []driver.SagaStep) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.Name
	}
	return out
}

// diffSaga lists the fields in which got differs from want; times are
// compared as instants, bytes byte for byte.
func diffSaga(got, want *driver.Saga) string {
	var d []string
	add := func(f string, g, w any) { d = append(d, fmt.Sprintf("%s: got %v, want %v", f, g, w)) }
	if got.ID != want.ID {
		add("ID", got.ID, want.ID)
	}
	if got.Type != want.Type {
		add("Type", got.Type, want.Type)
	}
	if got.State != want.State {
		add("State", got.State, want.State)
	}
	if !bytes.Equal(got.Data, want.Data) {
		add("Data", fmtBytes(got.Data), fmtBytes(want.Data))
	}
	if !got.CreatedAt.Equal(want.CreatedAt) {
		add("CreatedAt", got.CreatedAt, want.CreatedAt)
	}
	if !got.UpdatedAt.Equal(want.UpdatedAt) {
		add("UpdatedAt", got.UpdatedAt, want.UpdatedAt)
	}
	if !got.FinishedAt.Equal(want.FinishedAt) {
		add("FinishedAt", got.FinishedAt, want.FinishedAt)
	}
	return fmt.Sprint(d)
}

func wantSaga(t *testing.T, what string, got, want *driver.Saga) {
	t.Helper()
	if d := diffSaga(got, want); d != "[]" {
		t.Errorf("%s differs: %s", what, d)
	}
}

// A create inserts the saga once; a later create of the same ID, with other
// data, returns the stored saga unchanged.
func testSagaCreate[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ex := drv.Executor()
	want := fixture.SagaAt("saga-1", t0)
	got := fixture.SagaCreate(t, ex, want)
	wantSaga(t, "SagaCreate result", got, want)
	wantSaga(t, "SagaGet", sagaGet(t, ex, "saga-1"), want)

	again := fixture.SagaAt("saga-1", t0.Add(time.Hour))
	again.Type, again.Data = "other", []byte("other data")
	stored, created, err := ex.SagaCreate(t.Context(), again)
	if err != nil || created {
		t.Fatalf("second SagaCreate = created %v, %v; want the existing saga", created, err)
	}
	wantSaga(t, "second SagaCreate result", stored, want)
	wantSaga(t, "SagaGet after the second create", sagaGet(t, ex, "saga-1"), want)

	// nil data is stored as such.
	empty := fixture.SagaAt("saga-2", t0)
	empty.Data = nil
	if got := fixture.SagaCreate(t, ex, empty); len(got.Data) != 0 {
		t.Errorf("saga without data: Data = %q", got.Data)
	}
}

func testSagaCreateBadState[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	s := fixture.SagaAt("saga-1", t0)
	s.State = "paused"
	if _, _, err := drv.Executor().SagaCreate(t.Context(), s); err == nil {
		t.Error("SagaCreate with state paused succeeded; want an error")
	}
}

func testSagaGetMissing[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	if s, err := drv.Executor().SagaGet(t.Context(), &driver.SagaGetParams{SagaID: "nope"}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("SagaGet(missing) = %+v, %v; want ErrNotFound", s, err)
	}
}

// SetState changes only a saga in one of the expected states; finished_at
// follows the final states.
func testSagaSetState[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx, ex := t.Context(), drv.Executor()
	want := fixture.SagaCreate(t, ex, fixture.SagaAt("saga-1", t0))

	// Refused: the saga is running, not completed.
	changed, cur, err := ex.SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: "saga-1", From: []string{driver.SagaCompleted}, To: driver.SagaCompensated, Now: t0.Add(time.Second)})
	if err != nil || changed || cur != driver.SagaRunning {
		t.Errorf("SetState from completed of a running saga = %v, %q, %v; want unchanged, running", changed, cur, err)
	}
	wantSaga(t, "saga after a refused SetState", sagaGet(t, ex, "saga-1"), want)

	t1 := t0.Add(time.Minute)
	fixture.SagaSetState(t, ex, "saga-1", []string{driver.SagaRunning, driver.SagaFailed}, driver.SagaCompensating, t1)
	want.State, want.UpdatedAt = driver.SagaCompensating, t1
	wantSaga(t, "compensating saga", sagaGet(t, ex, "saga-1"), want)

	t2 := t1.Add(time.Minute)
	fixture.SagaSetState(t, ex, "saga-1", []string{driver.SagaCompensating}, driver.SagaFailed, t2)
	want.State, want.UpdatedAt = driver.SagaFailed, t2
	wantSaga(t, "failed saga (not finished)", sagaGet(t, ex, "saga-1"), want)

	t3 := t2.Add(time.Minute)
	fixture.SagaSetState(t, ex, "saga-1", []string{driver.SagaFailed}, driver.SagaCompensated, t3)
	want.State, want.UpdatedAt, want.FinishedAt = driver.SagaCompensated, t3, t3
	wantSaga(t, "compensated saga", sagaGet(t, ex, "saga-1"), want)

	// Moving to the same state is a change when the guard allows it.
	t4 := t3.Add(time.Minute)
	fixture.SagaSetState(t, ex, "saga-1", []string{driver.SagaCompensated}, driver.SagaCompensated, t4)
	want.UpdatedAt, want.FinishedAt = t4, t4
	wantSaga(t, "saga after compensated -> compensated", sagaGet(t, ex, "saga-1"), want)

	other := fixture.SagaCreate(t, ex, fixture.SagaAt("saga-2", t0))
	fixture.SagaSetState(t, ex, "saga-2", []string{driver.SagaRunning}, driver.SagaCompleted, t1)
	other.State, other.UpdatedAt, other.FinishedAt = driver.SagaCompleted, t1, t1
	wantSaga(t, "completed saga", sagaGet(t, ex, "saga-2"), other)

	if _, _, err := ex.SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: "nope", From: []string{driver.SagaRunning}, To: driver.SagaCompleted, Now: t1}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("SetState of a missing saga: %v; want ErrNotFound", err)
	}
	if _, _, err := ex.SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: "saga-2", From: []string{driver.SagaCompleted}, To: "paused", Now: t1}); err == nil {
		t.Error("SetState to an unknown state succeeded")
	}
	if changed, cur, err := ex.SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: "saga-2", From: nil, To: driver.SagaRunning, Now: t1}); err != nil || changed || cur != driver.SagaCompleted {
		t.Errorf("SetState with no expected state = %v, %q, %v; want unchanged", changed, cur, err)
	}
}

// A step is recorded once; the duplicate gets the stored result.
func testSagaStepRecord[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx, ex := t.Context(), drv.Executor()
	fixture.SagaCreate(t, ex, fixture.SagaAt("saga-1", t0))
	fixture.SagaRecord(t, ex, "saga-1", "reserve", driver.StepForward, nil, t0)
	result := []byte("res-\x00-42\xff")
	if err := ex.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: "saga-1", Step: "reserve", Result: result}); err != nil {
		t.Fatalf("SagaStepSetResult: %v", err)
	}
	for range 2 {
		inserted, existing, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "reserve", Kind: driver.StepForward, Result: []byte("other"), Now: t0.Add(time.Second)})
		if err != nil || inserted || !bytes.Equal(existing, result) {
			t.Errorf("duplicate SagaStepRecord = inserted %v, existing %q, %v; want the stored result %q", inserted, existing, err, result)
		}
	}
	// A result given to the record itself is stored.
	fixture.SagaRecord(t, ex, "saga-1", "charge", driver.StepForward, []byte("charge-7"), t0.Add(time.Second))
	if _, existing, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "charge", Kind: driver.StepForward, Result: nil, Now: t0}); err != nil || string(existing) != "charge-7" {
		t.Errorf("duplicate of a step recorded with a result: %q, %v; want charge-7", existing, err)
	}
	// A step recorded without a result has none.
	fixture.SagaRecord(t, ex, "saga-1", "notify", driver.StepForward, nil, t0.Add(2*time.Second))
	if inserted, existing, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "notify", Kind: driver.StepForward, Result: nil, Now: t0}); err != nil || inserted || existing != nil {
		t.Errorf("duplicate of a step without result = %v, %q, %v; want not inserted, nil result", inserted, existing, err)
	}
	// The same step name in another saga is another step.
	fixture.SagaCreate(t, ex, fixture.SagaAt("saga-2", t0))
	fixture.SagaRecord(t, ex, "saga-2", "reserve", driver.StepForward, nil, t0)

	steps := fixture.SagaSteps(t, ex, "saga-1")
	if got := sagaStepNames(steps); !slices.Equal(got, []string{"reserve", "charge", "notify"}) {
		t.Fatalf("steps of saga-1 = %v; want reserve, charge, notify", got)
	}
	first := steps[0]
	if first.SagaID != "saga-1" || first.Kind != driver.StepForward || !bytes.Equal(first.Result, result) || !first.CompletedAt.Equal(t0) {
		t.Errorf("first step = %+v; want saga-1, forward, result %q, completed at %s", first, result, t0)
	}
	if err := ex.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: "saga-1", Step: "nope", Result: result}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("SagaStepSetResult of a missing step: %v; want ErrNotFound", err)
	}
	if _, _, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "x", Kind: "sideways", Result: nil, Now: t0}); err == nil {
		t.Error("SagaStepRecord with an unknown kind succeeded")
	}
}

// A forward step is recorded only while the saga runs, a compensation only
// while it compensates; a step recorded before is reported whatever the
// state.
func testSagaStepState[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx, ex := t.Context(), drv.Executor()
	fixture.SagaCreate(t, ex, fixture.SagaAt("saga-1", t0))
	fixture.SagaRecord(t, ex, "saga-1", "reserve", driver.StepForward, []byte("r1"), t0)

	wantState := func(what string, err error, state string) {
		t.Helper()
		var se *driver.SagaStateError
		if !errors.Is(err, driver.ErrSagaState) || !errors.As(err, &se) || se.State != state || se.SagaID != "saga-1" {
			t.Errorf("%s: %v; want a *SagaStateError with state %s", what, err, state)
		}
	}
	_, _, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "compensate:reserve", Kind: driver.StepCompensation, Result: nil, Now: t0})
	wantState("compensation of a running saga", err, driver.SagaRunning)

	fixture.SagaSetState(t, ex, "saga-1", []string{driver.SagaRunning}, driver.SagaCompensating, t0)
	_, _, err = ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "charge", Kind: driver.StepForward, Result: nil, Now: t0})
	wantState("forward step of a compensating saga", err, driver.SagaCompensating)
	if inserted, existing, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "reserve", Kind: driver.StepForward, Result: nil, Now: t0}); err != nil || inserted || string(existing) != "r1" {
		t.Errorf("redelivered forward step of a compensating saga = %v, %q, %v; want its recorded result", inserted, existing, err)
	}
	fixture.SagaRecord(t, ex, "saga-1", "compensate:reserve", driver.StepCompensation, nil, t0)

	for _, state := range []string{driver.SagaFailed, driver.SagaCompensated} {
		fixture.SagaSetState(t, ex, "saga-1", []string{driver.SagaCompensating, driver.SagaFailed}, state, t0)
		_, _, err = ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "compensate:other", Kind: driver.StepCompensation, Result: nil, Now: t0})
		wantState("compensation of a "+state+" saga", err, state)
		_, _, err = ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "other", Kind: driver.StepForward, Result: nil, Now: t0})
		wantState("forward step of a "+state+" saga", err, state)
	}
	steps := fixture.SagaSteps(t, ex, "saga-1")
	if got := sagaStepNames(steps); !slices.Equal(got, []string{"reserve", "compensate:reserve"}) || steps[1].Kind != driver.StepCompensation {
		t.Errorf("steps = %+v; want reserve (forward), compensate:reserve (compensation)", steps)
	}
}

func testSagaStepMissing[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ex := drv.Executor()
	if _, _, err := ex.SagaStepRecord(t.Context(), &driver.SagaStepRecordParams{SagaID: "nope", Step: "reserve", Kind: driver.StepForward, Result: nil, Now: t0}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("SagaStepRecord of a missing saga: %v; want ErrNotFound", err)
	}
	if steps := fixture.SagaSteps(t, ex, "nope"); len(steps) != 0 {
		t.Errorf("SagaSteps of a missing saga = %v; want none", steps)
	}
}

// SagaSteps orders by seq, the order of recording, not by name or time.
func testSagaStepsOrder[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ex := drv.Executor()
	fixture.SagaCreate(t, ex, fixture.SagaAt("saga-1", t0))
	fixture.SagaCreate(t, ex, fixture.SagaAt("saga-2", t0))
	names := []string{"z", "b", "y", "a", "x"}
	for i, n := range names {
		// Interleave another saga's steps, and times running backwards.
		fixture.SagaRecord(t, ex, "saga-1", n, driver.StepForward, nil, t0.Add(-time.Duration(i)*time.Second))
		fixture.SagaRecord(t, ex, "saga-2", n, driver.StepForward, nil, t0)
	}
	steps := fixture.SagaSteps(t, ex, "saga-1")
	if got := sagaStepNames(steps); !slices.Equal(got, names) {
		t.Fatalf("steps = %v; want the order of recording %v", got, names)
	}
	for i := 1; i < len(steps); i++ {
		if steps[i].Seq <= steps[i-1].Seq {
			t.Errorf("seq of %s (%d) not after seq of %s (%d)", steps[i].Name, steps[i].Seq, steps[i-1].Name, steps[i-1].Seq)
		}
	}
}

// A saga created and a step recorded in a transaction that rolls back leave
// nothing.
func testSagaRollback[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx := t.Context()
	fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt("saga-1", t0))

	tx := begin(t, drv)
	ex := drv.UnwrapExecutor(tx)
	fixture.SagaCreate(t, ex, fixture.SagaAt("saga-2", t0))
	fixture.SagaRecord(t, ex, "saga-2", "reserve", driver.StepForward, nil, t0)
	fixture.SagaRecord(t, ex, "saga-1", "reserve", driver.StepForward, nil, t0)
	if err := ex.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: "saga-1", Step: "reserve", Result: []byte("r")}); err != nil {
		t.Fatalf("SagaStepSetResult: %v", err)
	}
	fixture.SagaSetState(t, ex, "saga-1", []string{driver.SagaRunning}, driver.SagaCompensating, t0)
	rollback(t, drv, tx)

	out := drv.Executor()
	if _, err := out.SagaGet(ctx, &driver.SagaGetParams{SagaID: "saga-2"}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("saga created in a rolled-back transaction: %v; want ErrNotFound", err)
	}
	if s := sagaGet(t, out, "saga-1"); s.State != driver.SagaRunning {
		t.Errorf("state set in a rolled-back transaction survived: %s", s.State)
	}
	if steps := fixture.SagaSteps(t, out, "saga-1"); len(steps) != 0 {
		t.Errorf("steps recorded in a rolled-back transaction survived: %v", sagaStepNames(steps))
	}
	// The retry records the step.
	fixture.SagaRecord(t, out, "saga-1", "reserve", driver.StepForward, nil, t0)
}

// Ten transactions record the same step at once: exactly one records it,
// the others get the result it stored.
func testSagaConcurrentDuplicates[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx := t.Context()
	fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt("saga-1", t0))
	const n = 10
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		inserted int
		results  [][]byte
		errs     []error
	)
	for i := range n {
		wg.Go(func() {
			err := func() error {
				tx, err := drv.Begin(ctx)
				if err != nil {
					return err
				}
				defer func() { _ = drv.Rollback(context.Background(), tx) }()
				ex := drv.UnwrapExecutor(tx)
				ok, existing, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "reserve", Kind: driver.StepForward, Result: nil, Now: t0})
				if err != nil {
					return err
				}
				if ok {
					if err := ex.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: "saga-1", Step: "reserve", Result: fmt.Appendf(nil, "winner-%d", i)}); err != nil {
						return err
					}
				}
				if err := drv.Commit(ctx, tx); err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				if ok {
					inserted++
				} else {
					results = append(results, existing)
				}
				return nil
			}()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d transactions failed: %v", len(errs), n, errs[0])
	}
	if inserted != 1 {
		t.Fatalf("%d of %d concurrent duplicates recorded the step; want exactly 1", inserted, n)
	}
	steps := fixture.SagaSteps(t, drv.Executor(), "saga-1")
	if len(steps) != 1 {
		t.Fatalf("steps = %v; want one", sagaStepNames(steps))
	}
	for _, r := range results {
		if !bytes.Equal(r, steps[0].Result) {
			t.Errorf("a duplicate got result %q; want the winner's %q", r, steps[0].Result)
		}
	}
}

type sagaRecordOutcome struct {
	inserted bool
	existing []byte
	err      error
}

// sagaRecordInBackground records the step in a new transaction, which it
// leaves open until the test ends.
func sagaRecordInBackground[TTx any](t *testing.T, drv driver.Driver[TTx], id, step string) <-chan sagaRecordOutcome {
	done, _ := sagaRecordInBackgroundTx(t, drv, id, step, false)
	return done
}

// sagaRecordInBackgroundTx is sagaRecordInBackground, with a savepoint
// when savepoint is set, and returns the transaction's executor (use it
// only once the outcome arrived).
func sagaRecordInBackgroundTx[TTx any](t *testing.T, drv driver.Driver[TTx], id, step string, savepoint bool) (<-chan sagaRecordOutcome, driver.Executor) {
	done := make(chan sagaRecordOutcome, 1)
	tx := begin(t, drv)
	ex := drv.UnwrapExecutor(tx)
	go func() {
		ok, existing, err := ex.SagaStepRecord(t.Context(), &driver.SagaStepRecordParams{SagaID: id, Step: step, Kind: driver.StepForward, Result: nil, Now: t0, Savepoint: savepoint})
		done <- sagaRecordOutcome{ok, existing, err}
	}()
	return done, ex
}

func sagaMustBlock[T any](t *testing.T, what string, done <-chan T) {
	t.Helper()
	select {
	case o := <-done:
		t.Fatalf("%s returned while the first transaction was still open: %+v", what, o)
	case <-time.After(blockWait):
	}
}

func sagaMustFinish[T any](t *testing.T, what string, done <-chan T) T {
	t.Helper()
	select {
	case o := <-done:
		return o
	case <-time.After(settleWait):
		t.Fatalf("%s still blocked %s after the first transaction ended", what, settleWait)
	}
	var zero T
	return zero
}

// A duplicate waits for the uncommitted transaction that recorded the step
// and, once it commits, gets the result it stored.
func testSagaTxWaitsForCommit[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	requireConcurrentWriters(t, drv)
	ctx := t.Context()
	fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt("saga-1", t0))
	tx := begin(t, drv)
	ex := drv.UnwrapExecutor(tx)
	fixture.SagaRecord(t, ex, "saga-1", "reserve", driver.StepForward, nil, t0)
	if err := ex.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: "saga-1", Step: "reserve", Result: []byte("first")}); err != nil {
		t.Fatalf("SagaStepSetResult: %v", err)
	}
	done := sagaRecordInBackground(t, drv, "saga-1", "reserve")
	sagaMustBlock(t, "duplicate SagaStepRecord", done)
	commit(t, drv, tx)
	o := sagaMustFinish(t, "duplicate SagaStepRecord", done)
	if o.err != nil || o.inserted || string(o.existing) != "first" {
		t.Errorf("duplicate after the first committed = %v, %q, %v; want not inserted, result first", o.inserted, o.existing, o.err)
	}
}

// A duplicate waiting for a transaction that rolls back records the step.
func testSagaTxRecordsAfterRollback[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	requireConcurrentWriters(t, drv)
	fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt("saga-1", t0))
	tx := begin(t, drv)
	fixture.SagaRecord(t, drv.UnwrapExecutor(tx), "saga-1", "reserve", driver.StepForward, nil, t0)
	done := sagaRecordInBackground(t, drv, "saga-1", "reserve")
	sagaMustBlock(t, "duplicate SagaStepRecord", done)
	rollback(t, drv, tx)
	o := sagaMustFinish(t, "duplicate SagaStepRecord", done)
	if o.err != nil || !o.inserted {
		t.Errorf("duplicate after the first rolled back = %v, %q, %v; want inserted", o.inserted, o.existing, o.err)
	}
}

// A state change waits for a transaction that is recording a step of the
// saga, so the step cannot commit under the old state after the change: once
// the change returns, the step is visible.
func testSagaSetStateWaitsForStep[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	requireConcurrentWriters(t, drv)
	ctx := t.Context()
	fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt("saga-1", t0))
	tx := begin(t, drv)
	fixture.SagaRecord(t, drv.UnwrapExecutor(tx), "saga-1", "charge", driver.StepForward, nil, t0)

	type outcome struct {
		changed bool
		cur     string
		err     error
	}
	done := make(chan outcome, 1)
	go func() {
		changed, cur, err := drv.Executor().SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: "saga-1", From: []string{driver.SagaRunning}, To: driver.SagaCompensating, Now: t0})
		done <- outcome{changed, cur, err}
	}()
	sagaMustBlock(t, "SagaSetState", done)
	commit(t, drv, tx)
	o := sagaMustFinish(t, "SagaSetState", done)
	if o.err != nil || !o.changed {
		t.Fatalf("SagaSetState after the step committed = %v, %q, %v; want changed", o.changed, o.cur, o.err)
	}
	if got := sagaStepNames(fixture.SagaSteps(t, drv.Executor(), "saga-1")); !slices.Equal(got, []string{"charge"}) {
		t.Errorf("steps after the state change = %v; want the committed step charge", got)
	}
	// A forward step that starts after the change is refused.
	if _, _, err := drv.Executor().SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "ship", Kind: driver.StepForward, Result: nil, Now: t0}); !errors.Is(err, driver.ErrSagaState) {
		t.Errorf("forward step after the change: %v; want ErrSagaState", err)
	}
}

// A duplicate that waits for the transaction that recorded the step does
// not hold up that transaction's own state change (the last step's
// transaction completes the saga; a step's failure aborts it): the change
// goes through, and the duplicate then gets the stored result. A duplicate
// that locked the saga before waiting for the step would deadlock with it.
//
// The duplicate's transaction first went through an earlier step again,
// recorded long before (a redelivered event that drives several steps):
// that took no lock either.
func testSagaDuplicateLetsStateChange[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	requireConcurrentWriters(t, drv)
	ctx := t.Context()
	fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt("saga-1", t0))
	fixture.SagaRecord(t, drv.Executor(), "saga-1", "reserve", driver.StepForward, nil, t0)
	tx := begin(t, drv)
	ex := drv.UnwrapExecutor(tx)
	fixture.SagaRecord(t, ex, "saga-1", "confirm", driver.StepForward, nil, t0)
	if err := ex.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: "saga-1", Step: "confirm", Result: []byte("first")}); err != nil {
		t.Fatalf("SagaStepSetResult: %v", err)
	}
	dup := drv.UnwrapExecutor(begin(t, drv))
	if ok, _, err := dup.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "reserve", Kind: driver.StepForward, Now: t0, Savepoint: true}); err != nil || ok {
		t.Fatalf("redelivered recorded step = %v, %v; want not inserted", ok, err)
	}
	done := make(chan sagaRecordOutcome, 1)
	go func() {
		ok, existing, err := dup.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "confirm", Kind: driver.StepForward, Now: t0, Savepoint: true})
		done <- sagaRecordOutcome{ok, existing, err}
	}()
	sagaMustBlock(t, "duplicate SagaStepRecord", done)
	type outcome struct {
		changed bool
		err     error
	}
	changed := make(chan outcome, 1)
	go func() {
		ok, _, err := ex.SagaSetState(ctx, &driver.SagaSetStateParams{SagaID: "saga-1", From: []string{driver.SagaRunning}, To: driver.SagaCompleted, Now: t0})
		changed <- outcome{ok, err}
	}()
	if o := sagaMustFinish(t, "SagaSetState of the transaction the duplicate waits for", changed); o.err != nil || !o.changed {
		t.Fatalf("SagaSetState while a duplicate waits = %v, %v; want changed", o.changed, o.err)
	}
	commit(t, drv, tx)
	o := sagaMustFinish(t, "duplicate SagaStepRecord", done)
	if o.err != nil || o.inserted || string(o.existing) != "first" {
		t.Errorf("duplicate after the first committed = %v, %q, %v; want not inserted, result first", o.inserted, o.existing, o.err)
	}
}

func testSagaList[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx, ex := t.Context(), drv.Executor()
	// Created in this order, updated in reverse order.
	ids := []string{"s-a", "s-b", "s-c", "s-d", "s-e"}
	to := []string{driver.SagaCompensating, driver.SagaFailed, driver.SagaRunning, driver.SagaCompensating, driver.SagaCompleted}
	for i, id := range ids {
		fixture.SagaCreate(t, ex, fixture.SagaAt(id, t0))
		if to[i] != driver.SagaRunning {
			fixture.SagaSetState(t, ex, id, []string{driver.SagaRunning}, to[i], t0.Add(time.Duration(len(ids)-i)*time.Minute))
		}
	}
	list, err := ex.SagaList(ctx, &driver.SagaListParams{States: []string{driver.SagaCompensating, driver.SagaFailed}, Limit: 10})
	if err != nil {
		t.Fatalf("SagaList: %v", err)
	}
	var got []string
	for _, s := range list {
		got = append(got, s.ID)
	}
	if want := []string{"s-d", "s-b", "s-a"}; !slices.Equal(got, want) {
		t.Errorf("SagaList(compensating, failed) = %v; want %v (least recently updated first)", got, want)
	}
	if list, err := ex.SagaList(ctx, &driver.SagaListParams{States: []string{driver.SagaCompensating, driver.SagaFailed}, Limit: 1}); err != nil || len(list) != 1 || list[0].ID != "s-d" {
		t.Errorf("SagaList with limit 1 = %+v, %v; want s-d", list, err)
	}
	// Pages: after s-d, then after s-b (s-a and s-b were updated at
	// t0+4m and t0+5m: the cursor's time counts before its ID).
	if list, err := ex.SagaList(ctx, &driver.SagaListParams{States: []string{driver.SagaCompensating, driver.SagaFailed}, Limit: 1,
		AfterID: list[0].ID, AfterUpdatedAt: list[0].UpdatedAt}); err != nil || len(list) != 1 || list[0].ID != "s-b" {
		t.Errorf("SagaList after s-d = %+v, %v; want s-b", list, err)
	}
	if list, err := ex.SagaList(ctx, &driver.SagaListParams{States: []string{driver.SagaCompensating, driver.SagaFailed}, Limit: 10,
		AfterID: "s-b", AfterUpdatedAt: t0.Add(4 * time.Minute)}); err != nil || len(list) != 1 || list[0].ID != "s-a" {
		t.Errorf("SagaList after s-b = %+v, %v; want s-a", list, err)
	}
	// Same time, later ID: only the IDs after it.
	if list, err := ex.SagaList(ctx, &driver.SagaListParams{States: []string{driver.SagaCompensating, driver.SagaFailed}, Limit: 10,
		AfterID: "s-0", AfterUpdatedAt: t0.Add(4 * time.Minute)}); err != nil || len(list) != 2 || list[0].ID != "s-b" {
		t.Errorf("SagaList after (t0+4m, s-0) = %+v, %v; want s-b, s-a", list, err)
	}
	if list, err := ex.SagaList(ctx, &driver.SagaListParams{States: []string{driver.SagaCompensating, driver.SagaFailed}, Limit: 10,
		AfterID: "s-a", AfterUpdatedAt: t0.Add(5 * time.Minute)}); err != nil || len(list) != 0 {
		t.Errorf("SagaList after the last = %+v, %v; want none", list, err)
	}
	// A list with a final state (another statement than the unfinished
	// states' one) finds it too, paged.
	finished := &driver.SagaListParams{States: []string{driver.SagaCompleted, driver.SagaCompensating}, Limit: 2}
	if list, err := ex.SagaList(ctx, finished); err != nil || len(list) != 2 || list[0].ID != "s-e" || list[1].ID != "s-d" {
		t.Errorf("SagaList(completed, compensating) = %+v, %v; want s-e, s-d", list, err)
	} else {
		finished.AfterID, finished.AfterUpdatedAt = list[1].ID, list[1].UpdatedAt
		if list, err := ex.SagaList(ctx, finished); err != nil || len(list) != 1 || list[0].ID != "s-a" {
			t.Errorf("SagaList(completed, compensating) after s-d = %+v, %v; want s-a", list, err)
		}
	}
	if list, err := ex.SagaList(ctx, &driver.SagaListParams{States: nil, Limit: 10}); err != nil || len(list) != 0 {
		t.Errorf("SagaList without states = %+v, %v; want none", list, err)
	}
	if _, err := ex.SagaList(ctx, &driver.SagaListParams{States: []string{driver.SagaRunning}, Limit: 0}); err == nil {
		t.Error("SagaList with limit 0 succeeded")
	}
}

// Only finished sagas older than the cutoff are deleted, oldest first, at
// most limit per call, with their steps.
func testSagaDeleteFinished[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx, ex := t.Context(), drv.Executor()
	cutoff := t0
	type sagaCase struct {
		id, state string
		at        time.Time
		deleted   bool
	}
	fixtures := []sagaCase{
		{"old-completed", driver.SagaCompleted, cutoff.Add(-2 * time.Hour), true},
		{"old-compensated", driver.SagaCompensated, cutoff.Add(-time.Hour), true},
		{"at-cutoff", driver.SagaCompleted, cutoff, false},
		{"young-completed", driver.SagaCompleted, cutoff.Add(time.Minute), false},
		{"old-running", driver.SagaRunning, cutoff.Add(-3 * time.Hour), false},
		{"old-failed", driver.SagaFailed, cutoff.Add(-3 * time.Hour), false},
		{"old-compensating", driver.SagaCompensating, cutoff.Add(-3 * time.Hour), false},
	}
	for _, f := range fixtures {
		fixture.SagaCreate(t, ex, fixture.SagaAt(f.id, f.at.Add(-time.Hour)))
		fixture.SagaRecord(t, ex, f.id, "step-1", driver.StepForward, nil, f.at)
		if f.state != driver.SagaRunning {
			fixture.SagaSetState(t, ex, f.id, []string{driver.SagaRunning}, f.state, f.at)
		}
	}
	res, err := ex.SagaDeleteFinishedBefore(ctx, &driver.SagaDeleteFinishedBeforeParams{Before: cutoff, Limit: 1})
	if err != nil || res.Deleted != 1 {
		t.Fatalf("first delete with limit 1 = %d, %v; want 1", res.Deleted, err)
	}
	if _, err := ex.SagaGet(ctx, &driver.SagaGetParams{SagaID: "old-completed"}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("the oldest finished saga survived the first batch: %v", err)
	}
	total := res.Deleted
	for range 5 {
		res, err = ex.SagaDeleteFinishedBefore(ctx, &driver.SagaDeleteFinishedBeforeParams{Before: cutoff, Limit: 1, After: res.Last})
		if err != nil {
			t.Fatalf("delete: %v", err)
		}
		total += res.Deleted
		if res.Deleted == 0 {
			break
		}
	}
	if total != 2 {
		t.Errorf("deleted %d sagas; want 2", total)
	}
	for _, f := range fixtures {
		_, err := ex.SagaGet(ctx, &driver.SagaGetParams{SagaID: f.id})
		steps := fixture.SagaSteps(t, ex, f.id)
		if f.deleted {
			if !errors.Is(err, driver.ErrNotFound) || len(steps) != 0 {
				t.Errorf("%s: SagaGet err %v, %d steps; want deleted with its steps", f.id, err, len(steps))
			}
		} else if err != nil || len(steps) != 1 {
			t.Errorf("%s: SagaGet err %v, %d steps; want kept with its step", f.id, err, len(steps))
		}
	}
	if _, err := ex.SagaDeleteFinishedBefore(ctx, &driver.SagaDeleteFinishedBeforeParams{Before: cutoff, Limit: 0}); err == nil {
		t.Error("SagaDeleteFinishedBefore with limit 0 succeeded")
	}
}

// A step recorded while another transaction holds an uncommitted state
// change of the saga waits for it: once the change commits, the step is
// refused under the new state (nothing is recorded); once it rolls back,
// the step is recorded. Without the wait, a step could commit after
// AbortTx and never be compensated.
func testSagaStepWaitsForStateChange[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	requireConcurrentWriters(t, drv)
	for _, tc := range []struct {
		end       string
		savepoint bool
	}{{"commit", false}, {"rollback", false}, {"commit", true}, {"rollback", true}} {
		end := tc.end
		name := end
		if tc.savepoint {
			name += "/savepoint"
		}
		t.Run(name, func(t *testing.T) {
			id := "saga-" + strings.ReplaceAll(name, "/", "-")
			fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt(id, t0))
			tx := begin(t, drv)
			fixture.SagaSetState(t, drv.UnwrapExecutor(tx), id, []string{driver.SagaRunning}, driver.SagaCompensating, t0)
			done, bg := sagaRecordInBackgroundTx(t, drv, id, "charge", tc.savepoint)
			sagaMustBlock(t, "SagaStepRecord during an uncommitted state change", done)
			if end == "commit" {
				commit(t, drv, tx)
			} else {
				rollback(t, drv, tx)
			}
			o := sagaMustFinish(t, "SagaStepRecord", done)
			var se *driver.SagaStateError
			switch {
			case end == "commit" && (!errors.As(o.err, &se) || se.State != driver.SagaCompensating || o.inserted):
				t.Errorf("step after the state change committed = %v, %v; want a *SagaStateError with state %s", o.inserted, o.err, driver.SagaCompensating)
			case end == "rollback" && (o.err != nil || !o.inserted):
				t.Errorf("step after the state change rolled back = %v, %v; want inserted", o.inserted, o.err)
			}
			// The refused step left nothing in its transaction, which
			// goes on.
			steps, err := bg.SagaSteps(t.Context(), &driver.SagaStepsParams{SagaID: id})
			if err != nil {
				t.Fatalf("SagaSteps in the transaction of the step: %v", err)
			}
			if want := map[string]int{"commit": 0, "rollback": 1}[end]; len(steps) != want {
				t.Errorf("steps in the transaction of the step after the state change %sed: %v; want %d", end, sagaStepNames(steps), want)
			}
		})
	}
}

// SagaStepEnd ends the savepoint SagaStepRecord opened: Failed rolls back
// the step's record and the writes made since, and leaves the transaction
// usable; success stores the result and keeps both. What the transaction
// wrote before the savepoint stays either way.
func testSagaStepSavepoint[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx := t.Context()
	fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt("saga-1", t0))
	fixture.SagaCreate(t, drv.Executor(), fixture.SagaAt("other", t0))
	tx := begin(t, drv)
	ex := drv.UnwrapExecutor(tx)
	// Written before the savepoint: survives its rollback.
	fixture.SagaRecord(t, ex, "saga-1", "before", driver.StepForward, nil, t0)

	record := func(step string) {
		t.Helper()
		inserted, _, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: step, Kind: driver.StepForward, Now: t0, Savepoint: true})
		if err != nil || !inserted {
			t.Fatalf("SagaStepRecord %s with a savepoint = %v, %v; want inserted", step, inserted, err)
		}
	}
	record("charge")
	// A write made after the savepoint (the step's effect): rolled back with it.
	fixture.SagaRecord(t, ex, "other", "effect", driver.StepForward, nil, t0)
	if err := ex.SagaStepEnd(ctx, &driver.SagaStepEndParams{SagaID: "saga-1", Step: "charge", Failed: true}); err != nil {
		t.Fatalf("SagaStepEnd failed: %v", err)
	}
	// The step again, in the same transaction: recorded anew.
	record("charge")
	if err := ex.SagaStepEnd(ctx, &driver.SagaStepEndParams{SagaID: "saga-1", Step: "charge", Result: []byte("charge-7")}); err != nil {
		t.Fatalf("SagaStepEnd: %v", err)
	}
	// A step without a result.
	record("notify")
	if err := ex.SagaStepEnd(ctx, &driver.SagaStepEndParams{SagaID: "saga-1", Step: "notify"}); err != nil {
		t.Fatalf("SagaStepEnd without a result: %v", err)
	}
	// A duplicate with a savepoint reports the recorded step.
	if inserted, existing, err := ex.SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "saga-1", Step: "charge", Kind: driver.StepForward, Now: t0, Savepoint: true}); err != nil || inserted || string(existing) != "charge-7" {
		t.Errorf("duplicate SagaStepRecord with a savepoint = %v, %q, %v; want charge-7", inserted, existing, err)
	}
	commit(t, drv, tx)

	steps := fixture.SagaSteps(t, drv.Executor(), "saga-1")
	if got := sagaStepNames(steps); !slices.Equal(got, []string{"before", "charge", "notify"}) {
		t.Fatalf("committed steps = %v; want before, charge, notify", got)
	}
	if string(steps[1].Result) != "charge-7" || steps[2].Result != nil {
		t.Errorf("results = %q, %q; want charge-7 and none", steps[1].Result, steps[2].Result)
	}
	if got := fixture.SagaSteps(t, drv.Executor(), "other"); len(got) != 0 {
		t.Errorf("the write rolled back to the savepoint committed: %v", sagaStepNames(got))
	}
}
