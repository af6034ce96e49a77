package saga_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/saga"
)

// The cleaner sweeps the sagas a Coordinator wrote: a completed or
// compensated saga that finished longer than Sagas.TTL ago is deleted with
// its steps; a young finished one is kept, and a redelivered step of it
// still gets its recorded result; a running, compensating or failed saga is
// never deleted, however old, and carries on after the sweep.
func testCleanupFinished[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	now := time.Now()
	at := func(d time.Duration) *saga.Config {
		return &saga.Config{Now: func() time.Time { return now.Add(d) }, CompensationBackoff: time.Millisecond}
	}
	old, young := f.coordinator(t, at(-80*time.Hour)), f.coordinator(t, at(-time.Hour))
	complete := func(c *saga.Coordinator[TTx]) string {
		id := newSagaID(t)
		f.start(t, c, id)
		tx := f.begin(t)
		if _, _, err := c.StepTx(ctx, tx, id, "step-1", f.apply(id, "step-1")); err != nil {
			t.Fatal(err)
		}
		if err := c.CompleteTx(ctx, tx, id); err != nil {
			t.Fatal(err)
		}
		f.commit(t, tx)
		return id
	}
	compensate := func(c *saga.Coordinator[TTx]) string {
		id := f.runUntilFailure(t, c, 2)
		if err := c.Compensate(ctx, id, f.compensations(t, id, stepsN(2))); err != nil {
			t.Fatal(err)
		}
		return id
	}
	oldCompleted, oldCompensated := complete(old), compensate(old)
	youngCompleted, youngCompensated := complete(young), compensate(young)
	running := f.runUntilFailure(t, old, 2)
	failed := f.runUntilFailure(t, old, 2)
	if err := old.Compensate(ctx, failed, nil); !errors.Is(err, saga.ErrNoCompensation) {
		t.Fatalf("Compensate without compensations: %v; want ErrNoCompensation", err)
	}
	compensating := f.runUntilFailure(t, old, 2)
	tx := f.begin(t)
	if err := old.AbortTx(ctx, tx, compensating); err != nil {
		t.Fatal(err)
	}
	f.commit(t, tx)

	sweep := func(now time.Time) cleanup.Report {
		t.Helper()
		c, err := cleanup.New(f.drv, &cleanup.Config{
			Now: func() time.Time { return now }, BatchSize: 1, Pause: cleanup.NoPause, Hold: cleanup.NoHold,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := c.RunOnce(ctx)
		if err != nil || rep.Skipped {
			t.Fatalf("RunOnce = %+v, %v", rep, err)
		}
		return rep
	}
	wantGone := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if s, err := old.Get(ctx, id); !errors.Is(err, saga.ErrNotFound) {
				t.Errorf("saga %s after the sweep: %+v, %v; want deleted", id, s, err)
			}
		}
	}
	wantKept := func(state saga.State, ids ...string) {
		t.Helper()
		for _, id := range ids {
			if s, err := old.Get(ctx, id); err != nil || s.State != state || !s.Done("step-1") {
				t.Errorf("saga %s after the sweep: %+v, %v; want kept, %s, with its steps", id, s, err, state)
			}
		}
	}

	// Default retention 72h: the sagas that finished 80h ago go.
	rep := sweep(now)
	if n := rep.Deleted(cleanup.TableSagas); n != 2 {
		t.Errorf("the sweep deleted %d sagas; want the 2 finished 80h ago", n)
	}
	wantGone(oldCompleted, oldCompensated)
	wantKept(saga.Completed, youngCompleted)
	wantKept(saga.Compensated, youngCompensated)
	wantKept(saga.Running, running)
	wantKept(saga.Failed, failed)
	wantKept(saga.Compensating, compensating)

	// A redelivered step of a kept saga is still skipped with its result.
	if res := run(t, young, youngCompleted, "step-1", f.apply(youngCompleted, "step-1"), false); string(res) != string(resultOf("step-1")) {
		t.Errorf("redelivered step after the sweep: result %q", res)
	}
	// The unfinished sagas carry on.
	run(t, old, running, "step-2", f.apply(running, "step-2"), true)
	if s, err := old.Resume(ctx, compensating, f.compensations(t, compensating, stepsN(2))); err != nil || s.State != saga.Compensated {
		t.Errorf("Resume of the compensating saga after the sweep = %+v, %v; want compensated", s, err)
	}
	f.mustEffects(t, youngCompleted, "step-1", 1)

	// Everything finished is eventually deleted; unfinished sagas never.
	rep = sweep(now.Add(100 * time.Hour))
	if n := rep.Deleted(cleanup.TableSagas); n != 3 {
		t.Errorf("the later sweep deleted %d sagas; want the 2 young ones and the one compensated since", n)
	}
	wantGone(youngCompleted, youngCompensated, compensating)
	wantKept(saga.Running, running)
	wantKept(saga.Failed, failed)
}
