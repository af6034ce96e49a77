package saga_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/saga"
)

// Start creates the saga once; later starts return it as stored.
func testStartIdempotent[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)

	tx := f.begin(t)
	if _, created, err := c.StartTx(ctx, tx, id, "order", []byte("v1")); err != nil || !created {
		t.Fatalf("Start = %v, %v", created, err)
	}
	f.rollback(t, tx)
	if _, err := c.Get(ctx, id); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("Get of a saga started in a rolled-back transaction: %v; want ErrNotFound", err)
	}

	tx = f.begin(t)
	s, created, err := c.StartTx(ctx, tx, id, "order", []byte("v1"))
	if err != nil || !created || s.State != saga.Running || s.Type != "order" || string(s.Data) != "v1" {
		t.Fatalf("Start = %+v, %v, %v; want a new running saga", s, created, err)
	}
	f.commit(t, tx)

	tx = f.begin(t)
	s, created, err = c.StartTx(ctx, tx, id, "order", []byte("v2"))
	if err != nil || created || string(s.Data) != "v1" {
		t.Errorf("second Start = %+v, %v, %v; want the stored saga with data v1", s, created, err)
	}
	if _, _, err := c.StartTx(ctx, tx, id, "refund", nil); !errors.Is(err, saga.ErrTypeMismatch) {
		t.Errorf("Start with another type: %v; want ErrTypeMismatch", err)
	}
	f.commit(t, tx)

	got := mustGet(t, c, id)
	if got.ID != id || got.State != saga.Running || string(got.Data) != "v1" || got.CreatedAt.IsZero() ||
		!got.FinishedAt.IsZero() || got.Steps == nil || len(got.Steps) != 0 {
		t.Errorf("Get = %+v; want the running saga without steps", got)
	}
	tx = f.begin(t)
	for _, bad := range [][2]string{{"", "order"}, {id, ""}, {strings.Repeat("x", saga.MaxNameLen+1), "order"}, {"a\nb", "order"}, {"\xff", "order"}} {
		if _, _, err := c.StartTx(ctx, tx, bad[0], bad[1], nil); !errors.Is(err, saga.ErrInvalidName) {
			t.Errorf("Start(%q, %q): %v; want ErrInvalidName", bad[0], bad[1], err)
		}
	}
	f.rollback(t, tx)
}

// Every step of a saga is delivered and retried at every point: lost
// before the step ran, failed before its effect, rolled back after its
// effect (before COMMIT), then committed, then redelivered again and again.
// Each step takes effect exactly once, and every redelivery after the
// commit returns the recorded result without running the step.
func testStepRetriedAtEveryPoint[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	steps := stepsN(3)
	for _, step := range steps {
		calls := 0
		fn := func(ctx context.Context, tx TTx) ([]byte, error) {
			calls++
			return f.apply(id, step)(ctx, tx)
		}

		// Before the effect: the delivery's transaction dies before the
		// step runs.
		f.rollback(t, f.begin(t))
		// Before the effect: the step's function fails before writing.
		tx := f.begin(t)
		_, ran, err := c.StepTx(ctx, tx, id, step, func(context.Context, TTx) ([]byte, error) { return nil, errBoom })
		var se *saga.StepError
		if ran || !errors.Is(err, errBoom) || !errors.As(err, &se) || se.Step != step || se.SagaID != id {
			t.Fatalf("%s: Step with a failing function = %v, %v; want a *StepError wrapping it", step, ran, err)
		}
		f.rollback(t, tx)
		f.mustEffects(t, id, step, 0)

		// After the effect, before COMMIT: the transaction rolls back.
		tx = f.begin(t)
		res, ran, err := c.StepTx(ctx, tx, id, step, fn)
		if err != nil || !ran || !bytes.Equal(res, resultOf(step)) {
			t.Fatalf("%s: Step = %q, %v, %v; want it to run", step, res, ran, err)
		}
		if s, err := c.GetTx(ctx, tx, id); err != nil || !s.Done(step) {
			t.Errorf("%s: inside the step's transaction, GetTx = %v; want the step done", step, err)
		}
		f.rollback(t, tx)
		f.mustEffects(t, id, step, 0)
		if mustGet(t, c, id).Done(step) {
			t.Fatalf("%s: recorded although its transaction rolled back", step)
		}

		// The retry runs it, once, and commits.
		tx = f.begin(t)
		if res, ran, err := c.StepTx(ctx, tx, id, step, fn); err != nil || !ran || !bytes.Equal(res, resultOf(step)) {
			t.Fatalf("%s: retried Step = %q, %v, %v; want it to run", step, res, ran, err)
		}
		f.commit(t, tx)

		// After COMMIT: every redelivery is skipped and gets the result.
		for i := range 3 {
			tx = f.begin(t)
			res, ran, err := c.StepTx(ctx, tx, id, step, fn)
			if err != nil || ran || !bytes.Equal(res, resultOf(step)) {
				t.Fatalf("%s: redelivery %d = %q, %v, %v; want skipped with the recorded result", step, i, res, ran, err)
			}
			if i == 1 {
				f.rollback(t, tx)
			} else {
				f.commit(t, tx)
			}
		}
		if res := run(t, c, id, step, fn, false); !bytes.Equal(res, resultOf(step)) {
			t.Errorf("%s: Step redelivery result %q", step, res)
		}
		if calls != 2 {
			t.Errorf("%s: the function ran %d times (1 rolled back, 1 committed); want 2", step, calls)
		}
		f.mustEffects(t, id, step, 1)
	}
	f.mustLog(t, id, steps...)
	s := mustGet(t, c, id)
	if got := stepNames(s); !slicesEqual(got, steps) || s.State != saga.Running {
		t.Errorf("saga %s: %v steps %v; want running with %v", id, s.State, got, steps)
	}
	for _, st := range s.Steps {
		if st.Compensation || !bytes.Equal(st.Result, resultOf(st.Name)) || st.CompletedAt.IsZero() {
			t.Errorf("step record %+v; want a forward step with its result", st)
		}
	}
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

// The documented consumer: inbox.ProcessTx and StepTx in one transaction. A
// redelivered event is dropped by the inbox; the same step triggered by
// another event (a retry published with a new ID) is skipped by Step.
func testStepJoinsCallerTx[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	ib, err := inbox.New(f.drv, &inbox.Config{Consumer: "order-saga"})
	if err != nil {
		t.Fatal(err)
	}
	id := newSagaID(t)
	consume := func(eventID uuid.UUID, wantApplied bool) {
		t.Helper()
		tx := f.begin(t)
		applied, err := ib.ProcessTx(ctx, tx, eventID, func(ctx context.Context, tx TTx) error {
			if _, _, err := c.StartTx(ctx, tx, id, "order", nil); err != nil {
				return err
			}
			if _, _, err := c.StepTx(ctx, tx, id, "step-1", f.apply(id, "step-1")); err != nil {
				return err
			}
			_, _, err := c.StepTx(ctx, tx, id, "step-2", f.apply(id, "step-2"))
			return err
		})
		if err != nil || applied != wantApplied {
			t.Fatalf("ProcessTx(%s) = %v, %v; want applied %v", eventID, applied, err, wantApplied)
		}
		f.commit(t, tx)
	}
	first := uuid.Must(uuid.NewV7())
	consume(first, true)
	consume(first, false)                  // redelivery: the inbox drops it
	consume(uuid.Must(uuid.NewV7()), true) // another event: Step skips
	f.mustLog(t, id, "step-1", "step-2")
}

// Ten deliveries of one step at once: it runs once, the others wait and get
// its result (PostgreSQL: they block on the primary key, then skip).
func testStepConcurrent[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	var calls atomic.Int32
	fn := func(ctx context.Context, tx TTx) ([]byte, error) {
		calls.Add(1)
		res, err := f.apply(id, "step-1")(ctx, tx)
		time.Sleep(20 * time.Millisecond) // keep the transaction open a while
		return res, err
	}
	const n = 10
	var (
		wg      sync.WaitGroup
		ranN    atomic.Int32
		errsMu  sync.Mutex
		errs    []error
		results = make([][]byte, n)
	)
	for i := range n {
		wg.Go(func() {
			res, ran, err := c.Step(t.Context(), id, "step-1", fn)
			if err != nil {
				errsMu.Lock()
				errs = append(errs, err)
				errsMu.Unlock()
				return
			}
			if ran {
				ranN.Add(1)
			}
			results[i] = res
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d deliveries failed: %v", len(errs), errs[0])
	}
	if ranN.Load() != 1 || calls.Load() != 1 {
		t.Errorf("%d concurrent deliveries: %d ran the step, the function was called %d times; want 1 and 1", n, ranN.Load(), calls.Load())
	}
	for i, r := range results {
		if !bytes.Equal(r, resultOf("step-1")) {
			t.Errorf("delivery %d got result %q", i, r)
		}
	}
	f.mustEffects(t, id, "step-1", 1)
}

// Ten deliveries at once, the first of which fails after writing its
// effect: the failed one leaves nothing, exactly one other runs the step.
func testStepConcurrentFirstFails[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	var calls atomic.Int32
	fn := func(ctx context.Context, tx TTx) ([]byte, error) {
		first := calls.Add(1) == 1
		res, err := f.apply(id, "step-1")(ctx, tx)
		time.Sleep(20 * time.Millisecond)
		if first {
			return nil, errBoom
		}
		return res, err
	}
	const n = 10
	var wg sync.WaitGroup
	var ranN, failed, skipped atomic.Int32
	for range n {
		wg.Go(func() {
			_, ran, err := c.Step(t.Context(), id, "step-1", fn)
			switch {
			case errors.Is(err, errBoom):
				failed.Add(1)
			case err != nil:
				t.Errorf("Step: %v", err)
			case ran:
				ranN.Add(1)
			default:
				skipped.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() != 1 || ranN.Load() != 1 || skipped.Load() != n-2 || calls.Load() != 2 {
		t.Errorf("failed %d, ran %d, skipped %d, calls %d; want 1, 1, %d, 2", failed.Load(), ranN.Load(), skipped.Load(), calls.Load(), n-2)
	}
	f.mustEffects(t, id, "step-1", 1)
}

// A panicking step rolls back (Step) and is run again by the retry.
func testStepPanic[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v; want the step's panic", r)
			}
		}()
		_, _, _ = c.Step(t.Context(), id, "step-1", func(ctx context.Context, tx TTx) ([]byte, error) {
			if err := f.effect(ctx, tx, id, "step-1"); err != nil {
				return nil, err
			}
			panic("boom")
		})
	}()
	f.mustEffects(t, id, "step-1", 0)
	run(t, c, id, "step-1", f.apply(id, "step-1"), true)
	run(t, c, id, "step-1", f.apply(id, "step-1"), false)
	f.mustEffects(t, id, "step-1", 1)
}

// A step of a saga that was never started does not run.
func testStepNotStarted[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	called := false
	_, ran, err := c.Step(t.Context(), id, "step-1", func(context.Context, TTx) ([]byte, error) {
		called = true
		return nil, nil
	})
	if !errors.Is(err, saga.ErrNotFound) || ran || called {
		t.Errorf("Step of an unknown saga = ran %v, called %v, %v; want ErrNotFound without running", ran, called, err)
	}
}

func testStepInvalidNames[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	fn := f.apply(id, "x")
	for _, bad := range [][2]string{
		{id, "compensate:step-1"}, {id, ""}, {"", "step-1"}, {id, "a\x00b"}, {id, strings.Repeat("s", saga.MaxNameLen+1)},
	} {
		if _, _, err := c.Step(t.Context(), bad[0], bad[1], fn); !errors.Is(err, saga.ErrInvalidName) {
			t.Errorf("Step(%q, %q): %v; want ErrInvalidName", bad[0], bad[1], err)
		}
	}
	if _, _, err := c.Step(t.Context(), id, "step-1", nil); err == nil {
		t.Error("Step with a nil function succeeded")
	}
	f.mustLog(t, id)

	// Every entry point refuses them the same way, before the database
	// sees them (PostgreSQL would abort the caller's transaction on a NUL).
	ctx := t.Context()
	for _, bad := range []string{"", "a\x00b", "\xff", strings.Repeat("s", saga.MaxNameLen+1)} {
		tx := f.begin(t)
		if _, err := c.GetTx(ctx, tx, bad); !errors.Is(err, saga.ErrInvalidName) {
			t.Errorf("GetTx(%q): %v; want ErrInvalidName", bad, err)
		}
		if err := c.CompleteTx(ctx, tx, bad); !errors.Is(err, saga.ErrInvalidName) {
			t.Errorf("CompleteTx(%q): %v; want ErrInvalidName", bad, err)
		}
		if err := c.AbortTx(ctx, tx, bad); !errors.Is(err, saga.ErrInvalidName) {
			t.Errorf("AbortTx(%q): %v; want ErrInvalidName", bad, err)
		}
		if _, err := c.EmitTx(ctx, tx, bad, "step-1", "", newEvent(t, "StockReserved.v1", `{}`)); !errors.Is(err, saga.ErrInvalidName) {
			t.Errorf("EmitTx(%q, step-1): %v; want ErrInvalidName", bad, err)
		}
		if _, err := c.EmitTx(ctx, tx, id, bad, "", newEvent(t, "StockReserved.v1", `{}`)); !errors.Is(err, saga.ErrInvalidName) {
			t.Errorf("EmitTx(id, %q): %v; want ErrInvalidName", bad, err)
		}
		// A compensation of a step with the longest name emits under
		// CompensationName(step), longer than MaxNameLen: allowed.
		long := saga.CompensationName(strings.Repeat("s", saga.MaxNameLen))
		if _, err := c.EmitTx(ctx, tx, id, long, "", newEvent(t, "StockReleased.v1", `{}`)); err != nil {
			t.Errorf("EmitTx under the compensation of a %d-byte step name: %v", saga.MaxNameLen, err)
		}
		if _, err := c.GetTx(ctx, tx, id); err != nil {
			t.Fatalf("GetTx after the refusals: %v (the transaction must stay usable)", err)
		}
		f.rollback(t, tx)
		if _, err := c.Resume(ctx, bad, nil); !errors.Is(err, saga.ErrInvalidName) {
			t.Errorf("Resume(%q): %v; want ErrInvalidName", bad, err)
		}
	}
}

// Once a saga is aborted, new forward steps are refused with a *StateError;
// a redelivery of a step that completed still gets its result.
func testStepRefusedOnceAborted[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	run(t, c, id, "step-1", f.apply(id, "step-1"), true)
	tx := f.begin(t)
	if err := c.AbortTx(ctx, tx, id); err != nil {
		t.Fatalf("Abort: %v", err)
	}
	f.commit(t, tx)

	_, ran, err := c.Step(ctx, id, "step-2", f.apply(id, "step-2"))
	var se *saga.StateError
	if ran || !errors.Is(err, saga.ErrState) || !errors.As(err, &se) || se.State != saga.Compensating || se.SagaID != id {
		t.Errorf("step of an aborted saga = ran %v, %v; want a *StateError (compensating)", ran, err)
	}
	if res := run(t, c, id, "step-1", f.apply(id, "step-1"), false); !bytes.Equal(res, resultOf("step-1")) {
		t.Errorf("redelivered completed step: result %q", res)
	}
	f.mustLog(t, id, "step-1")
}

// Complete finishes the saga; afterwards nothing runs any more.
func testComplete[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	run(t, c, id, "step-1", f.apply(id, "step-1"), true)

	// The last step and CompleteTx in one transaction, rolled back first.
	for _, commit := range []bool{false, true} {
		tx := f.begin(t)
		if _, _, err := c.StepTx(ctx, tx, id, "step-2", f.apply(id, "step-2")); err != nil {
			t.Fatalf("Step: %v", err)
		}
		if err := c.CompleteTx(ctx, tx, id); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if commit {
			f.commit(t, tx)
		} else {
			f.rollback(t, tx)
			if s := mustGet(t, c, id); s.State != saga.Running || s.Done("step-2") {
				t.Fatalf("after a rolled-back Complete: %s, steps %v", s.State, stepNames(s))
			}
		}
	}
	s := mustGet(t, c, id)
	if s.State != saga.Completed || !s.State.Finished() || s.FinishedAt.IsZero() {
		t.Errorf("completed saga: %+v", s)
	}
	tx := f.begin(t)
	if err := c.CompleteTx(ctx, tx, id); err != nil {
		t.Errorf("Complete of a completed saga: %v; want a no-op", err)
	}
	if err := c.AbortTx(ctx, tx, id); !errors.Is(err, saga.ErrState) {
		t.Errorf("Abort of a completed saga: %v; want ErrState", err)
	}
	f.rollback(t, tx)
	if _, _, err := c.Step(ctx, id, "step-3", f.apply(id, "step-3")); !errors.Is(err, saga.ErrState) {
		t.Errorf("step of a completed saga: %v; want ErrState", err)
	}
	if err := c.Compensate(ctx, id, saga.Compensations[TTx]{"step-1": f.undo(t, id), "step-2": f.undo(t, id)}); !errors.Is(err, saga.ErrState) {
		t.Errorf("Compensate of a completed saga: %v; want ErrState", err)
	}
	f.mustLog(t, id, "step-1", "step-2")
}

// A step whose function fails leaves nothing in the caller's transaction:
// neither its record nor what the function wrote before failing. The
// consumer of the failure may then abort the saga in that same transaction
// and commit, and the step that never took effect is not compensated; a
// retry in the same transaction runs the function.
func testStepTxFailureLeavesNothing[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	run(t, c, id, "reserve", f.apply(id, "reserve"), true)
	tx := f.begin(t)
	_, ran, err := c.StepTx(ctx, tx, id, "charge", func(ctx context.Context, tx TTx) ([]byte, error) {
		if err := f.effect(ctx, tx, id, "charge"); err != nil { // written, then the step fails
			return nil, err
		}
		return nil, errors.New("card declined")
	})
	var se *saga.StepError
	if !errors.As(err, &se) || ran {
		t.Fatalf("StepTx = ran %v, %v; want a *StepError", ran, err)
	}
	s, err := c.GetTx(ctx, tx, id)
	if err != nil {
		t.Fatalf("GetTx: %v", err)
	}
	if s.Done("charge") {
		t.Errorf("inside the transaction after the failed step: Done(charge) = true; want false")
	}
	called := false
	_, _, err = c.StepTx(ctx, tx, id, "charge", func(context.Context, TTx) ([]byte, error) {
		called = true
		return nil, errors.New("card declined again")
	})
	if !errors.As(err, &se) || !called {
		t.Errorf("retry of the failed step in the same transaction = called %v, %v; want its function to run and fail again", called, err)
	}
	if err := c.AbortTx(ctx, tx, id); err != nil {
		t.Fatalf("AbortTx in the transaction of the failed step: %v", err)
	}
	f.commit(t, tx)
	undone := map[string]int{}
	if err := c.Compensate(ctx, id, saga.Compensations[TTx]{
		"reserve": func(context.Context, TTx, saga.StepRecord) ([]byte, error) { undone["reserve"]++; return nil, nil },
		"charge":  func(context.Context, TTx, saga.StepRecord) ([]byte, error) { undone["charge"]++; return nil, nil },
	}); err != nil {
		t.Fatalf("Compensate: %v", err)
	}
	f.mustEffects(t, id, "charge", 0)
	if undone["charge"] != 0 || undone["reserve"] != 1 {
		t.Errorf("compensations ran %v; want reserve once and never charge (its function failed: it never took effect)", undone)
	}
	if s := mustGet(t, c, id); s.State != saga.Compensated || s.Done("charge") {
		t.Errorf("saga %s, steps %v; want compensated without charge", s.State, stepNames(s))
	}
}

// The reviewer's scenario: a retry of a failed step in the same transaction
// runs the function, and abort and commit in that transaction compensate
// nothing of it.
func testStepTxRetryInSameTx[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	tx := f.begin(t)
	_, _, err := c.StepTx(ctx, tx, id, "charge", func(context.Context, TTx) ([]byte, error) {
		return nil, errors.New("card declined") // no effect written
	})
	var se *saga.StepError
	if !errors.As(err, &se) {
		t.Fatalf("StepTx: %v, want a *StepError", err)
	}
	res, ran, err := c.StepTx(ctx, tx, id, "charge", f.apply(id, "charge"))
	if err != nil || !ran || !bytes.Equal(res, resultOf("charge")) {
		t.Errorf("retry in the same tx = %q, ran %v, %v; want the function to run", res, ran, err)
	}
	f.rollback(t, tx)
	f.mustEffects(t, id, "charge", 0)
	// The abort-in-the-same-transaction pattern, with nothing recorded.
	tx = f.begin(t)
	if _, _, err := c.StepTx(ctx, tx, id, "charge", func(context.Context, TTx) ([]byte, error) {
		return nil, errors.New("card declined")
	}); !errors.As(err, &se) {
		t.Fatalf("StepTx: %v, want a *StepError", err)
	}
	if err := c.AbortTx(ctx, tx, id); err != nil {
		t.Fatal(err)
	}
	f.commit(t, tx)
	refunds := 0
	if err := c.Compensate(ctx, id, saga.Compensations[TTx]{
		"charge": func(context.Context, TTx, saga.StepRecord) ([]byte, error) { refunds++; return nil, nil },
	}); err != nil {
		t.Fatal(err)
	}
	f.mustEffects(t, id, "charge", 0)
	if refunds != 0 {
		t.Errorf("the compensation of a step whose function failed (never took effect) ran %d times; want 0", refunds)
	}
}

// A step function that panics inside StepTx leaves nothing in the caller's
// transaction either: the panic goes on, and the transaction can still
// record the step and commit.
func testStepTxPanicLeavesNothing[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	tx := f.begin(t)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v; want the step's panic", r)
			}
		}()
		_, _, _ = c.StepTx(ctx, tx, id, "step-1", func(ctx context.Context, tx TTx) ([]byte, error) {
			if err := f.effect(ctx, tx, id, "step-1"); err != nil {
				return nil, err
			}
			panic("boom")
		})
	}()
	if _, ran, err := c.StepTx(ctx, tx, id, "step-1", f.apply(id, "step-1")); err != nil || !ran {
		t.Fatalf("StepTx after the panic in the same transaction = ran %v, %v; want it to run", ran, err)
	}
	f.commit(t, tx)
	f.mustEffects(t, id, "step-1", 1)
	run(t, c, id, "step-1", f.apply(id, "step-1"), false)
}

// A step function whose statement fails leaves the caller's transaction
// usable (on PostgreSQL the failed statement aborted it; StepTx rolls back
// to before the step): the consumer can abort the saga in it and commit.
func testStepTxFailedStatement[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	tx := f.begin(t)
	_, _, err := c.StepTx(ctx, tx, id, "charge", func(ctx context.Context, tx TTx) ([]byte, error) {
		if err := f.effect(ctx, tx, id, "charge"); err != nil {
			return nil, err
		}
		return nil, f.bad(ctx, tx)
	})
	var se *saga.StepError
	if !errors.As(err, &se) {
		t.Fatalf("StepTx: %v, want a *StepError", err)
	}
	if err := c.AbortTx(ctx, tx, id); err != nil {
		t.Fatalf("AbortTx after a step whose statement failed: %v", err)
	}
	f.commit(t, tx)
	f.mustEffects(t, id, "charge", 0)
	if s := mustGet(t, c, id); s.State != saga.Compensating || s.Done("charge") {
		t.Errorf("saga %s, steps %v; want compensating without charge", s.State, stepNames(s))
	}
}

// hungDriver's connection stops answering when a failed step's savepoint is
// rolled back: SagaStepEnd with Failed returns only when its context ends,
// as a statement on a connection to a database that became unreachable
// does (until TCP gives up, many minutes later).
type hungDriver[TTx any] struct{ driver.Driver[TTx] }

func (d hungDriver[TTx]) SagasTx(tx TTx) driver.SagaExecutor {
	return hungSagas{d.Driver.SagasTx(tx)}
}

type hungSagas struct{ driver.SagaExecutor }

func (e hungSagas) SagaStepEnd(ctx context.Context, p *driver.SagaStepEndParams) error {
	if !p.Failed {
		return e.SagaExecutor.SagaStepEnd(ctx, p)
	}
	<-ctx.Done()
	return ctx.Err()
}

// A step whose function fails because the caller's context ended returns,
// even when undoing its record then hangs: the undo is bounded, not left
// to wait for ever on a context that can no longer end. The error is not a
// *StepError (the record may still be in tx): the caller rolls back.
func testStepTxCancelledUndoBounded[TTx any](t *testing.T, f *fixture[TTx]) {
	c, err := saga.New(hungDriver[TTx]{f.drv}, &saga.Config{CompensationBackoff: time.Millisecond})
	if err != nil {
		t.Fatalf("saga.New: %v", err)
	}
	id := newSagaID(t)
	f.start(t, c, id)
	tx := f.begin(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := c.StepTx(ctx, tx, id, "charge", func(ctx context.Context, tx TTx) ([]byte, error) {
			cancel() // the caller's deadline passes while the step runs
			return nil, ctx.Err()
		})
		done <- err
	}()
	select {
	case err := <-done:
		var se *saga.StepError
		if err == nil || errors.As(err, &se) || !errors.Is(err, context.Canceled) {
			t.Errorf("StepTx = %v; want the step's context.Canceled, and not a *StepError (roll back)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("StepTx still blocked 20s after its context was cancelled: undoing the failed step's record waits for ever")
	}
	f.rollback(t, tx)
	f.mustEffects(t, id, "charge", 0)
}

// The name is all StepTx knows of a step: a second, different step under
// a name already recorded is skipped as a redelivery of the first, with
// its result, without an error (docs/sagas.md, Steps: give every step its
// own name).
func testStepSameNameTwice[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	run(t, c, id, "notify", f.apply(id, "notify"), true)
	res := run(t, c, id, "notify", f.apply(id, "notify-again"), false)
	if string(res) != string(resultOf("notify")) {
		t.Errorf("the second step under the name got %q; want the first one's result", res)
	}
	f.mustLog(t, id, "notify")
}

// A step's function that aborts the saga through tx and then fails has
// its abort undone with the rest of what it wrote (StepFunc's doc): the
// saga is still running; AbortTx after StepTx returned the *StepError
// sticks.
func testStepTxAbortInsideFailedStep[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	tx := f.begin(t)
	_, _, err := c.StepTx(ctx, tx, id, "charge", func(ctx context.Context, tx TTx) ([]byte, error) {
		if err := c.AbortTx(ctx, tx, id); err != nil {
			t.Errorf("AbortTx inside the step: %v", err)
		}
		return nil, errBoom
	})
	var se *saga.StepError
	if !errors.As(err, &se) {
		t.Fatalf("StepTx = %v; want a *StepError", err)
	}
	if s, err := c.GetTx(ctx, tx, id); err != nil || s.State != saga.Running {
		t.Fatalf("after the failed step the saga is %v (%v); want running: the abort inside it was undone", s, err)
	}
	if err := c.AbortTx(ctx, tx, id); err != nil {
		t.Fatalf("AbortTx after the StepError: %v", err)
	}
	f.commit(t, tx)
	if s := mustGet(t, c, id); s.State != saga.Compensating {
		t.Errorf("saga %s; want compensating", s.State)
	}
}
