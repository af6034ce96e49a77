package saga_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/dberr"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/saga"
)

// compensations returns the usual compensation of every step in steps.
func (f *fixture[TTx]) compensations(t *testing.T, sagaID string, steps []string) saga.Compensations[TTx] {
	comps := saga.Compensations[TTx]{}
	for _, s := range steps {
		comps[s] = f.undo(t, sagaID)
	}
	return comps
}

// listed returns the saga id as List(Compensating, Failed) reports it, or
// nil if it is not listed.
func listed[TTx any](t *testing.T, c *saga.Coordinator[TTx], id string) *saga.Saga {
	t.Helper()
	list, err := c.List(t.Context(), 100000, saga.Compensating, saga.Failed)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, s := range list {
		if s.ID == id {
			return s
		}
	}
	return nil
}

// runUntilFailure starts a saga and runs steps 1..n, the n-th of which fails
// after writing its effect (rolled back). It returns the saga ID.
func (f *fixture[TTx]) runUntilFailure(t *testing.T, c *saga.Coordinator[TTx], n int) string {
	t.Helper()
	id := newSagaID(t)
	f.start(t, c, id)
	for i, step := range stepsN(n) {
		if i < n-1 {
			run(t, c, id, step, f.apply(id, step), true)
			continue
		}
		_, ran, err := c.Step(t.Context(), id, step, func(ctx context.Context, tx TTx) ([]byte, error) {
			if _, err := f.apply(id, step)(ctx, tx); err != nil {
				return nil, err
			}
			return nil, errBoom
		})
		if ran || !errors.Is(err, errBoom) {
			t.Fatalf("failing step %s = %v, %v; want its error", step, ran, err)
		}
	}
	return id
}

// wantCompensated checks the effects of a saga whose steps 1..n-1 completed
// and were compensated in reverse order, and its final state.
func (f *fixture[TTx]) wantCompensated(t *testing.T, c *saga.Coordinator[TTx], id string, n int) {
	t.Helper()
	var want []string
	done := stepsN(n - 1)
	want = append(want, done...)
	for i := len(done) - 1; i >= 0; i-- {
		want = append(want, saga.CompensationName(done[i]))
	}
	f.mustLog(t, id, want...)
	s := mustGet(t, c, id)
	if s.State != saga.Compensated || s.FinishedAt.IsZero() {
		t.Errorf("saga %s: state %s, finished at %s; want compensated and finished", id, s.State, s.FinishedAt)
	}
	for _, st := range done {
		cs, ok := s.Step(saga.CompensationName(st))
		if !ok || !cs.Compensation || string(cs.Result) != "undone "+st {
			t.Errorf("saga %s: compensation record of %s = %+v, %v", id, st, cs, ok)
		}
	}
	if s.Compensated(fmt.Sprintf("step-%d", n)) {
		t.Errorf("saga %s: the failed step-%d, which never completed, was compensated", id, n)
	}
}

// A failure at step N compensates steps N-1..1, each once, in reverse
// order; the failed step is never compensated. N = 1 (nothing to undo) to 4.
func testCompensateFailureAtN[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	for n := 1; n <= 4; n++ {
		id := f.runUntilFailure(t, c, n)
		if err := c.Compensate(t.Context(), id, f.compensations(t, id, stepsN(4))); err != nil {
			t.Fatalf("N=%d: Compensate: %v", n, err)
		}
		f.wantCompensated(t, c, id, n)
	}
}

// Compensate called again (a retry, a redelivered failure event, Resume)
// repeats nothing.
func testCompensateCalledAgain[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := f.runUntilFailure(t, c, 4)
	comps := f.compensations(t, id, stepsN(4))
	for i := range 3 {
		if err := c.Compensate(t.Context(), id, comps); err != nil {
			t.Fatalf("Compensate #%d: %v", i+1, err)
		}
	}
	if s, err := c.Resume(t.Context(), id, comps); err != nil || s.State != saga.Compensated {
		t.Errorf("Resume of a compensated saga = %v, %v", s, err)
	}
	f.wantCompensated(t, c, id, 4)
}

// Five Compensate calls at once: each compensation runs once, in reverse
// order, and every call reports success.
func testCompensateConcurrent[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := f.runUntilFailure(t, c, 4)
	comps := f.compensations(t, id, stepsN(4))
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			if err := c.Compensate(t.Context(), id, comps); err != nil {
				t.Errorf("concurrent Compensate: %v", err)
			}
		})
	}
	wg.Wait()
	f.wantCompensated(t, c, id, 4)
}

// A compensation in the middle fails (after writing its effect, which rolls
// back): Compensate stops there, marks the saga failed and returns a
// *CompensationError; the second call resumes with it and does not repeat
// the compensation that had finished.
func testCompensateFailsOnce[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, &saga.Config{CompensationAttempts: 1})
	id := f.runUntilFailure(t, c, 4)
	comps := f.compensations(t, id, stepsN(4))
	var calls3, calls2 atomic.Int32
	undo := comps["step-2"]
	comps["step-2"] = func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
		res, err := undo(ctx, tx, fwd)
		if calls2.Add(1) == 1 {
			return nil, errBoom
		}
		return res, err
	}
	undo3 := comps["step-3"]
	comps["step-3"] = func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
		calls3.Add(1)
		return undo3(ctx, tx, fwd)
	}

	err := c.Compensate(ctx, id, comps)
	var ce *saga.CompensationError
	if !errors.As(err, &ce) || ce.Step != "step-2" || ce.Attempts != 1 || !errors.Is(err, errBoom) || ce.SagaID != id {
		t.Fatalf("Compensate with a failing compensation: %v; want a *CompensationError for step-2", err)
	}
	f.mustLog(t, id, "step-1", "step-2", "step-3", "compensate:step-3")
	s := mustGet(t, c, id)
	if s.State != saga.Failed || !s.FinishedAt.IsZero() || !s.Compensated("step-3") || s.Compensated("step-2") {
		t.Errorf("after the failure: state %s, steps %v; want failed with step-3 compensated only", s.State, stepNames(s))
	}
	if got := listed(t, c, id); got == nil || got.State != saga.Failed {
		t.Errorf("List(compensating, failed) has %+v; want the failed saga", got)
	}
	// A new forward step is still refused.
	if _, _, err := c.Step(ctx, id, "step-5", f.apply(id, "step-5")); !errors.Is(err, saga.ErrState) {
		t.Errorf("forward step of a failed saga: %v; want ErrState", err)
	}

	// A fresh Coordinator (a restarted process) resumes.
	c2 := f.coordinator(t, &saga.Config{CompensationAttempts: 1})
	if err := c2.Compensate(ctx, id, comps); err != nil {
		t.Fatalf("second Compensate: %v", err)
	}
	f.wantCompensated(t, c, id, 4)
	if calls3.Load() != 1 || calls2.Load() != 2 {
		t.Errorf("compensation of step-3 ran %d times (want 1), of step-2 %d times (want 2)", calls3.Load(), calls2.Load())
	}
	if got := listed(t, c, id); got != nil {
		t.Errorf("List after the resume has %+v; want the saga gone from it", got)
	}
}

// A compensation that fails transiently is retried within the same call.
func testCompensateRetried[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, &saga.Config{CompensationAttempts: 3, CompensationBackoff: time.Millisecond})
	id := f.runUntilFailure(t, c, 3)
	comps := f.compensations(t, id, stepsN(3))
	var calls atomic.Int32
	undo := comps["step-2"]
	comps["step-2"] = func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
		res, err := undo(ctx, tx, fwd)
		if calls.Add(1) < 3 {
			return nil, errBoom
		}
		return res, err
	}
	if err := c.Compensate(t.Context(), id, comps); err != nil {
		t.Fatalf("Compensate: %v", err)
	}
	if calls.Load() != 3 {
		t.Errorf("compensation of step-2 was attempted %d times; want 3", calls.Load())
	}
	f.wantCompensated(t, c, id, 3)
}

// A completed step without an entry in the map is an error before anything
// is compensated; a nil entry records the compensation without effect.
func testCompensateMissing[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := f.runUntilFailure(t, c, 3)
	comps := saga.Compensations[TTx]{"step-2": f.undo(t, id)}
	if err := c.Compensate(ctx, id, comps); !errors.Is(err, saga.ErrNoCompensation) {
		t.Fatalf("Compensate without the compensation of step-1: %v; want ErrNoCompensation", err)
	}
	f.mustLog(t, id, "step-1", "step-2")
	if s := mustGet(t, c, id); s.State != saga.Failed {
		t.Errorf("state %s; want failed", s.State)
	}
	comps["step-1"] = nil // nothing to undo
	if err := c.Compensate(ctx, id, comps); err != nil {
		t.Fatalf("Compensate: %v", err)
	}
	f.mustLog(t, id, "step-1", "step-2", "compensate:step-2")
	s := mustGet(t, c, id)
	if s.State != saga.Compensated || !s.Compensated("step-1") || !s.Compensated("step-2") {
		t.Errorf("saga %s, steps %v; want compensated, both steps", s.State, stepNames(s))
	}
}

func testCompensateNothing[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	if err := c.Compensate(ctx, id, nil); err != nil {
		t.Fatalf("Compensate of a saga without steps: %v", err)
	}
	if s := mustGet(t, c, id); s.State != saga.Compensated {
		t.Errorf("state %s; want compensated", s.State)
	}
	if err := c.Compensate(ctx, newSagaID(t), nil); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("Compensate of an unknown saga: %v; want ErrNotFound", err)
	}
	if err := c.Compensate(ctx, "", nil); !errors.Is(err, saga.ErrInvalidName) {
		t.Errorf("Compensate(\"\"): %v; want ErrInvalidName", err)
	}
	f.mustLog(t, id)
}

// A forward step whose transaction is still open when Compensate starts:
// Compensate waits for it and compensates it too, so it is never left
// behind.
func testCompensateWaitsForStep[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	run(t, c, id, "step-1", f.apply(id, "step-1"), true)
	tx := f.begin(t)
	if _, ran, err := c.StepTx(ctx, tx, id, "step-2", f.apply(id, "step-2")); err != nil || !ran {
		t.Fatalf("Step = %v, %v", ran, err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Compensate(ctx, id, f.compensations(t, id, stepsN(2))) }()
	select {
	case err := <-done:
		t.Fatalf("Compensate returned while a step was being recorded: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	f.commit(t, tx)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Compensate: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Compensate still blocked 10s after the step committed")
	}
	f.wantCompensated(t, c, id, 3)
}

// AbortTx in the consumer's transaction, then a crash before Compensate: the
// recovery loop finds the saga with List and finishes it with Resume.
func testAbortThenRecover[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := f.runUntilFailure(t, c, 3)

	tx := f.begin(t)
	if err := c.AbortTx(ctx, tx, id); err != nil {
		t.Fatalf("Abort: %v", err)
	}
	f.rollback(t, tx)
	if s := mustGet(t, c, id); s.State != saga.Running {
		t.Fatalf("state after a rolled-back Abort: %s", s.State)
	}
	for range 2 {
		tx = f.begin(t)
		if err := c.AbortTx(ctx, tx, id); err != nil {
			t.Fatalf("Abort: %v", err)
		}
		f.commit(t, tx)
	}
	// The process dies here. Its successor:
	rec := f.coordinator(t, nil)
	if got := listed(t, rec, id); got == nil || got.State != saga.Compensating || got.Type != "order" {
		t.Fatalf("List has %+v; want the compensating saga", got)
	}
	s, err := rec.Resume(ctx, id, f.compensations(t, id, stepsN(3)))
	if err != nil || s.State != saga.Compensated {
		t.Fatalf("Resume = %+v, %v; want compensated", s, err)
	}
	f.wantCompensated(t, c, id, 3)
	tx = f.begin(t)
	if err := c.AbortTx(ctx, tx, id); err != nil {
		t.Errorf("Abort of a compensated saga: %v; want a no-op", err)
	}
	f.rollback(t, tx)
}

// A running saga is read back from the database by a fresh Coordinator and
// continues with its next step; its completed steps are skipped.
func testResumeRunning[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	run(t, c, id, "step-1", f.apply(id, "step-1"), true)

	c2 := f.coordinator(t, nil)
	s, err := c2.Resume(t.Context(), id, nil)
	if err != nil || s.State != saga.Running || !s.Done("step-1") || s.Done("step-2") || string(s.Data) != `{"order":1}` {
		t.Fatalf("Resume = %+v, %v; want running with step-1 done", s, err)
	}
	if st, _ := s.Step("step-1"); string(st.Result) != string(resultOf("step-1")) {
		t.Errorf("step-1 result %q", st.Result)
	}
	run(t, c2, id, "step-1", f.apply(id, "step-1"), false)
	run(t, c2, id, "step-2", f.apply(id, "step-2"), true)
	f.mustLog(t, id, "step-1", "step-2")
	if _, err := c2.Resume(t.Context(), newSagaID(t), nil); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("Resume of an unknown saga: %v; want ErrNotFound", err)
	}
}

// Finished sagas are deleted by DeleteFinished (the cleaner's rule); others
// are kept.
func testDeleteFinished[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	completed := newSagaID(t)
	f.start(t, c, completed)
	tx := f.begin(t)
	if _, _, err := c.StepTx(ctx, tx, completed, "step-1", f.apply(completed, "step-1")); err != nil {
		t.Fatal(err)
	}
	if err := c.CompleteTx(ctx, tx, completed); err != nil {
		t.Fatal(err)
	}
	f.commit(t, tx)
	compensated := f.runUntilFailure(t, c, 2)
	if err := c.Compensate(ctx, compensated, f.compensations(t, compensated, stepsN(2))); err != nil {
		t.Fatal(err)
	}
	failed := f.runUntilFailure(t, c, 2)
	if err := c.Compensate(ctx, failed, nil); !errors.Is(err, saga.ErrNoCompensation) {
		t.Fatal(err)
	}
	running := f.runUntilFailure(t, c, 2)

	if n, err := saga.DeleteFinished(ctx, f.drv.Executor(), time.Now().Add(-time.Hour), 10); err != nil || n != 0 {
		t.Errorf("DeleteFinished before the sagas finished = %d, %v; want 0", n, err)
	}
	n, err := saga.DeleteFinished(ctx, f.drv.Executor(), time.Now().Add(time.Hour), 10)
	if err != nil || n != 2 {
		t.Errorf("DeleteFinished = %d, %v; want 2", n, err)
	}
	for _, id := range []string{completed, compensated} {
		if _, err := c.Get(ctx, id); !errors.Is(err, saga.ErrNotFound) {
			t.Errorf("finished saga %s: %v; want deleted", id, err)
		}
	}
	for _, id := range []string{failed, running} {
		if s, err := c.Get(ctx, id); err != nil || len(s.Steps) != 1 {
			t.Errorf("unfinished saga %s: %+v, %v; want kept with its step", id, s, err)
		}
	}
}

// Every compensation is retried at every point: its first attempt fails
// before its effect, its second after its effect (before COMMIT, so the
// effect rolls back), its third commits; then Compensate is called again
// after the commit, by this process and by a restarted one. Each
// compensation takes effect exactly once, in reverse order, and its
// function is never called after its commit.
func testCompensateRetriedAtEveryPoint[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	cfg := &saga.Config{CompensationAttempts: 3, CompensationBackoff: time.Millisecond}
	c := f.coordinator(t, cfg)
	id := f.runUntilFailure(t, c, 4)
	comps := saga.Compensations[TTx]{}
	calls := map[string]*atomic.Int32{}
	for _, step := range stepsN(4) {
		n := new(atomic.Int32)
		calls[step] = n
		undo := f.undo(t, id)
		comps[step] = func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
			switch n.Add(1) {
			case 1: // before the effect
				return nil, errBoom
			case 2: // after the effect, before COMMIT
				if _, err := undo(ctx, tx, fwd); err != nil {
					return nil, err
				}
				return nil, errBoom
			}
			return undo(ctx, tx, fwd)
		}
	}
	if err := c.Compensate(ctx, id, comps); err != nil {
		t.Fatalf("Compensate: %v", err)
	}
	// After COMMIT: again, and from a restarted process.
	if err := c.Compensate(ctx, id, comps); err != nil {
		t.Fatalf("Compensate after the commit: %v", err)
	}
	if s, err := f.coordinator(t, cfg).Resume(ctx, id, comps); err != nil || s.State != saga.Compensated {
		t.Fatalf("Resume by a restarted process = %+v, %v; want compensated", s, err)
	}
	f.wantCompensated(t, c, id, 4)
	for _, step := range stepsN(3) {
		if n := calls[step].Load(); n != 3 {
			t.Errorf("compensation of %s was called %d times; want 3 (2 failed attempts, 1 commit)", step, n)
		}
	}
	if n := calls["step-4"].Load(); n != 0 {
		t.Errorf("compensation of the failed step-4, which never completed, was called %d times", n)
	}
}

// A compensation whose own error happens to wrap saga.ErrNotFound or
// saga.ErrState (it looked up another saga, say) is an ordinary failed
// attempt: it is retried, and if it keeps failing the saga is marked Failed
// with a *CompensationError, like any other failure.
func testCompensateFnErrorWrapsSagaSentinel[TTx any](t *testing.T, f *fixture[TTx]) {
	for _, sentinel := range []error{saga.ErrNotFound, saga.ErrState} {
		c := f.coordinator(t, &saga.Config{CompensationAttempts: 2, CompensationBackoff: time.Millisecond})
		id := f.runUntilFailure(t, c, 3)
		comps := f.compensations(t, id, stepsN(3))
		var calls atomic.Int32
		comps["step-2"] = func(context.Context, TTx, saga.StepRecord) ([]byte, error) {
			calls.Add(1)
			return nil, fmt.Errorf("look up the child saga: %w", sentinel)
		}
		err := c.Compensate(t.Context(), id, comps)
		var ce *saga.CompensationError
		if !errors.As(err, &ce) || ce.Step != "step-2" || !errors.Is(err, sentinel) {
			t.Errorf("%v: Compensate = %v; want a *CompensationError for step-2", sentinel, err)
		}
		if n := calls.Load(); n != 2 {
			t.Errorf("%v: the compensation ran %d times; want 2 (CompensationAttempts)", sentinel, n)
		}
		if s := mustGet(t, c, id); s.State != saga.Failed {
			t.Errorf("%v: saga is %s after the compensation kept failing; want failed", sentinel, s.State)
		}
	}
}

// Compensate called from inside a step's or a compensation's function, for
// the same saga, would wait for the transaction that function runs in (its
// lock on the saga, or SQLite's only connection), which cannot end before
// Compensate returns: it hung until its context ended. It is refused at
// once, and the saga is left as it was.
func testCompensateFromInsideStep[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := f.runUntilFailure(t, c, 2)
	inner := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		watch := stallmeter.Start(t) // seconds without CPU are the machine's
		start := time.Now()
		err := c.Compensate(ctx, id, f.compensations(t, id, stepsN(2)))
		took, stalled := time.Since(start), watch.Stop()
		if err == nil || errors.Is(err, context.DeadlineExceeded) || took > time.Second+stalled {
			t.Errorf("Compensate from inside a step of the saga = %v after %s (the process stalled %s); want an error at once", err, took.Round(time.Millisecond), stalled)
		}
		return nil
	}
	run(t, c, id, "step-3", func(ctx context.Context, _ TTx) ([]byte, error) { return nil, inner(ctx) }, true)
	if s := mustGet(t, c, id); s.State != saga.Running {
		t.Errorf("state %s after the refused Compensate; want running", s.State)
	}
	// From a compensation's function too.
	comps := f.compensations(t, id, stepsN(3))
	comps["step-3"] = func(ctx context.Context, _ TTx, _ saga.StepRecord) ([]byte, error) { return nil, inner(ctx) }
	if err := c.Compensate(t.Context(), id, comps); err != nil {
		t.Fatalf("Compensate: %v", err)
	}
	if s := mustGet(t, c, id); s.State != saga.Compensated {
		t.Errorf("state %s; want compensated", s.State)
	}
}

// The database fails under a compensation (on PostgreSQL its connection
// killed, as a failover or pg_terminate_backend does; SQLite's file refuses
// writes, SQLITE_READONLY, as a filesystem remounted read-only does) on
// more attempts than Config.CompensationAttempts: once inside the
// compensation's own SQL (a *StepError), once after it returned (the
// compensation's record or COMMIT). Nothing is wrong with the
// compensation: no call gives a *CompensationError, the saga never goes
// Failed (it stays Compensating, listed for Resume), and the call after
// the database is back compensates it, the compensation's effect applied
// once.
func testCompensateDatabaseFault[TTx any](t *testing.T, f *fixture[TTx]) {
	fault := f.kill
	if fault == nil {
		fault = func(t *testing.T, tx TTx) { f.readOnly(t.Context(), t, tx) }
	}
	ctx := t.Context()
	c := f.coordinator(t, &saga.Config{CompensationAttempts: 2, CompensationBackoff: time.Millisecond})
	id := f.runUntilFailure(t, c, 4)
	comps := f.compensations(t, id, stepsN(4))
	const faults = 3 // more than CompensationAttempts
	var calls atomic.Int32
	undo := comps["step-2"]
	comps["step-2"] = func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
		n := calls.Add(1)
		res, err := undo(ctx, tx, fwd)
		if err != nil || n > faults {
			return res, err
		}
		fault(t, tx)
		if n%2 == 1 {
			// The compensation's next statement finds its connection gone.
			return nil, f.effect(ctx, tx, id, "after the kill")
		}
		return res, nil // the saga's own statements find it gone
	}
	for i := 1; ; i++ {
		err := c.Compensate(ctx, id, comps)
		if f.writable != nil {
			f.writable(t) // the database is back
		}
		if err == nil {
			break
		}
		if i > faults {
			t.Fatalf("Compensate #%d: %v; want success once the database is back", i, err)
		}
		var ce *saga.CompensationError
		if errors.As(err, &ce) || !dberr.Transient(err) {
			t.Errorf("Compensate #%d under a database fault: %v; want the database's error, not a *CompensationError", i, err)
		}
		if s := mustGet(t, c, id); s.State != saga.Compensating || s.Compensated("step-2") || !s.Compensated("step-3") {
			t.Fatalf("after Compensate #%d under a database fault: state %s, steps %v; want compensating with step-3 compensated only", i, s.State, stepNames(s))
		}
		if got := listed(t, c, id); got == nil || got.State != saga.Compensating {
			t.Errorf("List(compensating, failed) after Compensate #%d has %+v; want the compensating saga", i, got)
		}
	}
	if calls.Load() != faults+1 {
		t.Errorf("compensation of step-2 ran %d times; want %d (one per call, the faults not retried within a call)", calls.Load(), faults+1)
	}
	f.wantCompensated(t, c, id, 4)
}

// The compensation's writes are refused a privilege (PostgreSQL's 42501, a
// GRANT revoked: the compensation runs as a role that may only read;
// SQLite's SQLITE_AUTH, an authorizer that refuses them) on more attempts
// than Config.CompensationAttempts: an operator must act, nothing is wrong
// with the compensation. The saga stays Compensating, and the call after
// the privilege is back compensates it once.
func testCompensatePrivilegeRefused[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, &saga.Config{CompensationAttempts: 2, CompensationBackoff: time.Millisecond})
	id := f.runUntilFailure(t, c, 3)
	comps := f.compensations(t, id, stepsN(3))
	var refused atomic.Bool
	refused.Store(true)
	if f.authorize != nil {
		f.authorize(t, func(table string) bool { return refused.Load() && table == "effect" })
	}
	var calls atomic.Int32
	undo := comps["step-2"]
	comps["step-2"] = func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
		calls.Add(1)
		if refused.Load() && f.exec != nil {
			if err := f.exec(ctx, tx, `SET LOCAL ROLE pg_read_all_data`); err != nil {
				t.Errorf("SET LOCAL ROLE: %v", err)
			}
		}
		return undo(ctx, tx, fwd)
	}
	err := c.Compensate(ctx, id, comps)
	var ce *saga.CompensationError
	if errors.As(err, &ce) || !dberr.Misconfigured(err) {
		t.Fatalf("Compensate with the privilege refused: %v; want the database's 42501, not a *CompensationError", err)
	}
	if s := mustGet(t, c, id); s.State != saga.Compensating || s.Compensated("step-2") {
		t.Fatalf("after the refusal: state %s, steps %v; want compensating, step-2 not compensated", s.State, stepNames(s))
	}
	if calls.Load() != 1 {
		t.Errorf("compensation of step-2 ran %d times in one call; want 1", calls.Load())
	}
	refused.Store(false) // the operator granted it again
	if _, err := c.Resume(ctx, id, comps); err != nil {
		t.Fatalf("Resume once the privilege is back: %v", err)
	}
	f.wantCompensated(t, c, id, 3)
}

// A compensation whose own statement keeps running into statement_timeout
// (57014: a query too slow for the limit, a missing index) or lock_timeout
// (55P03: a row another transaction keeps locked) is a failed attempt, not
// a fault of the database: otherwise a compensation that can never finish
// would stay Compensating for ever, retried by every recovery round, with
// no *CompensationError and no Failed state for an alert to see. After
// CompensationAttempts attempts the saga is Failed (List finds it), and
// the call after the cause is gone compensates it once.
func testCompensateTimeoutIsAnAttempt[TTx any](t *testing.T, f *fixture[TTx]) {
	if f.exec == nil {
		t.Skip("SQLite has no statement or lock timeout (the compensation's transaction holds the only write lock)")
	}
	for _, tc := range []struct {
		name, set, stmt, code string
	}{
		{"StatementTimeout", `SET LOCAL statement_timeout = '20ms'`, `SELECT pg_sleep(2)`, "57014"},
		{"LockTimeout", `SET LOCAL lock_timeout = '20ms'`, `SELECT pg_advisory_xact_lock(hashtext('%s'))`, "55P03"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			c := f.coordinator(t, &saga.Config{CompensationAttempts: 2, CompensationBackoff: time.Millisecond})
			id := f.runUntilFailure(t, c, 3)
			stmt := tc.stmt
			if strings.Contains(stmt, "%s") {
				stmt = fmt.Sprintf(stmt, id)
				// Another transaction keeps the lock the compensation needs.
				holder := f.begin(t)
				if err := f.exec(ctx, holder, stmt); err != nil {
					t.Fatalf("take the lock: %v", err)
				}
				defer func() { _ = f.drv.Rollback(context.WithoutCancel(ctx), holder) }()
			}
			comps := f.compensations(t, id, stepsN(3))
			var calls atomic.Int32
			var blocked atomic.Bool
			blocked.Store(true)
			undo := comps["step-2"]
			comps["step-2"] = func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
				calls.Add(1)
				if blocked.Load() {
					if err := f.exec(ctx, tx, tc.set); err != nil {
						return nil, err
					}
					if err := f.exec(ctx, tx, stmt); err != nil {
						return nil, err
					}
					t.Errorf("%s did not time out", stmt)
				}
				return undo(ctx, tx, fwd)
			}
			err := c.Compensate(ctx, id, comps)
			var ce *saga.CompensationError
			if !errors.As(err, &ce) || dberr.SQLState(err) != tc.code {
				t.Fatalf("Compensate whose compensation always times out: %v; want a *CompensationError wrapping %s", err, tc.code)
			}
			if n := calls.Load(); n != 2 {
				t.Errorf("compensation of step-2 attempted %d times; want CompensationAttempts = 2", n)
			}
			if s := mustGet(t, c, id); s.State != saga.Failed || s.Compensated("step-2") || s.Compensated("step-1") {
				t.Errorf("after the timeouts: state %s, steps %v; want failed, nothing compensated", s.State, stepNames(s))
			}
			if got := listed(t, c, id); got == nil || got.State != saga.Failed {
				t.Errorf("List(compensating, failed) has %+v; want the failed saga", got)
			}
			blocked.Store(false) // an index added, the lock's holder gone
			if _, err := c.Resume(ctx, id, comps); err != nil {
				t.Fatalf("Resume once the compensation no longer times out: %v", err)
			}
			f.wantCompensated(t, c, id, 3)
		})
	}
}
