package saga_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/saga"
)

// Two replicas (two Coordinators) race on one saga: forward steps are
// delivered while the other replica compensates it. Whatever the
// interleaving, every forward step either committed (effect once) and is
// compensated once, in reverse order of the steps, or was refused and left
// nothing; the saga ends Compensated.
func testRaceStepsAndCompensate[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	a, b := f.coordinator(t, nil), f.replicaCoordinator(t)
	for round := range 5 {
		id := newSagaID(t)
		f.start(t, a, id)
		run(t, a, id, "step-1", f.apply(id, "step-1"), true)
		steps := stepsN(8)
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			ranSteps []string
		)
		release := make(chan struct{})
		for _, st := range steps[1:] {
			wg.Go(func() {
				<-release
				_, ran, err := a.Step(ctx, id, st, func(ctx context.Context, tx TTx) ([]byte, error) {
					res, err := f.apply(id, st)(ctx, tx)
					time.Sleep(time.Duration(len(st)%3) * time.Millisecond)
					return res, err
				})
				switch {
				case err == nil && ran:
					mu.Lock()
					ranSteps = append(ranSteps, st)
					mu.Unlock()
				case errors.Is(err, saga.ErrState):
				default:
					t.Errorf("round %d: Step(%s) = %v, %v; want it run or refused", round, st, ran, err)
				}
			})
		}
		var cerr error
		wg.Go(func() {
			<-release
			cerr = b.Compensate(ctx, id, f.compensations(t, id, steps))
		})
		close(release)
		wg.Wait()
		if cerr != nil {
			t.Fatalf("round %d: Compensate: %v", round, cerr)
		}
		s := mustGet(t, b, id)
		if s.State != saga.Compensated {
			t.Fatalf("round %d: state %s; want compensated", round, s.State)
		}
		// The forward steps as recorded, in order, and their compensations
		// in reverse order after them.
		var fwd []string
		for _, st := range s.Steps {
			if !st.Compensation {
				fwd = append(fwd, st.Name)
			}
		}
		want := slices.Clone(fwd)
		for i := len(fwd) - 1; i >= 0; i-- {
			want = append(want, saga.CompensationName(fwd[i]))
		}
		if got := stepNames(s); !slices.Equal(got, want) {
			t.Errorf("round %d: recorded steps %v; want %v", round, got, want)
		}
		for _, st := range steps {
			n := 0
			if slices.Contains(fwd, st) {
				n = 1
			}
			f.mustEffects(t, id, st, n)
			f.mustEffects(t, id, saga.CompensationName(st), n)
		}
		slices.Sort(ranSteps)
		got := slices.Clone(fwd[1:])
		slices.Sort(got)
		if !slices.Equal(ranSteps, got) {
			t.Errorf("round %d: Step reported ran for %v; recorded %v", round, ranSteps, got)
		}
	}
}

// AbortTx and CompleteTx of one running saga, each on its own replica and
// transaction, at once: exactly one wins and the saga stays in its state;
// the loser gets a *StateError, and a Compensate after a completion changes
// nothing.
func testRaceAbortComplete[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	a, b := f.coordinator(t, nil), f.replicaCoordinator(t)
	for round := range 10 {
		id := newSagaID(t)
		f.start(t, a, id)
		run(t, a, id, "step-1", f.apply(id, "step-1"), true)
		var completeErr, abortErr error
		var wg sync.WaitGroup
		release := make(chan struct{})
		end := func(c *saga.Coordinator[TTx], op func(tx TTx) error) error {
			<-release
			tx, err := f.drv.Begin(ctx)
			if err != nil {
				return err
			}
			if err := op(tx); err != nil {
				_ = f.drv.Rollback(ctx, tx)
				return err
			}
			return f.drv.Commit(ctx, tx)
		}
		wg.Go(func() {
			completeErr = end(a, func(tx TTx) error { return a.CompleteTx(ctx, tx, id) })
		})
		wg.Go(func() {
			abortErr = end(b, func(tx TTx) error { return b.AbortTx(ctx, tx, id) })
		})
		close(release)
		wg.Wait()
		s := mustGet(t, a, id)
		switch {
		case completeErr == nil && errors.Is(abortErr, saga.ErrState):
			if s.State != saga.Completed {
				t.Fatalf("round %d: Complete won, state %s", round, s.State)
			}
			if err := b.Compensate(ctx, id, f.compensations(t, id, stepsN(1))); !errors.Is(err, saga.ErrState) {
				t.Errorf("round %d: Compensate of a completed saga: %v; want a *StateError", round, err)
			}
		case abortErr == nil && errors.Is(completeErr, saga.ErrState):
			if s.State != saga.Compensating {
				t.Fatalf("round %d: Abort won, state %s", round, s.State)
			}
			if err := b.Compensate(ctx, id, f.compensations(t, id, stepsN(1))); err != nil {
				t.Fatalf("round %d: Compensate: %v", round, err)
			}
			f.mustEffects(t, id, saga.CompensationName("step-1"), 1)
		default:
			t.Fatalf("round %d: Complete %v, Abort %v; want exactly one refused", round, completeErr, abortErr)
		}
		if s := mustGet(t, a, id); s.State != saga.Completed && s.State != saga.Compensated {
			t.Errorf("round %d: final state %s", round, s.State)
		}
	}
}

// Two Compensates of one saga at once, the first attempt of every
// compensation failing: each compensation takes effect once, in reverse
// order, and the saga ends Compensated (or Failed, resumed by one more
// call).
func testRaceCompensateFlaky[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, &saga.Config{CompensationAttempts: 2, CompensationBackoff: time.Millisecond})
	id := f.runUntilFailure(t, c, 5)
	var mu sync.Mutex
	failedOnce := map[string]bool{}
	comps := saga.Compensations[TTx]{}
	for _, st := range stepsN(4) {
		comps[st] = func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
			mu.Lock()
			first := !failedOnce[st]
			failedOnce[st] = true
			mu.Unlock()
			if first {
				return nil, fmt.Errorf("transient %s", st)
			}
			return f.undo(t, id)(ctx, tx, fwd)
		}
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { _ = c.Compensate(ctx, id, comps) })
	}
	wg.Wait()
	if s := mustGet(t, c, id); s.State != saga.Compensated {
		if err := c.Compensate(ctx, id, comps); err != nil {
			t.Fatalf("Compensate after the race (state %s): %v", s.State, err)
		}
	}
	f.wantCompensated(t, c, id, 5)
}

// A step redelivered (a second event, another consumer) while the
// transaction that ran it first goes on to complete the saga: the
// redelivery waits for that transaction, then skips the step; neither
// fails. The redelivery's transaction went through an earlier step again
// first (an event that drives two steps), which holds up nothing either.
func testRaceRedeliveryAndComplete[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	a, b := f.coordinator(t, nil), f.replicaCoordinator(t)
	id := newSagaID(t)
	f.start(t, a, id)
	run(t, a, id, "step-1", f.apply(id, "step-1"), true)
	tx := f.begin(t)
	if _, ran, err := a.StepTx(ctx, tx, id, "step-2", f.apply(id, "step-2")); err != nil || !ran {
		t.Fatalf("StepTx = %v, %v", ran, err)
	}
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			tx2, err := f.drv.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = f.drv.Rollback(context.WithoutCancel(ctx), tx2) }()
			for _, st := range []string{"step-1", "step-2"} {
				_, ran, err := b.StepTx(ctx, tx2, id, st, f.apply(id, st))
				if err != nil {
					return err
				}
				if ran {
					return fmt.Errorf("the redelivered %s ran again", st)
				}
			}
			return f.drv.Commit(ctx, tx2)
		}()
	}()
	time.Sleep(200 * time.Millisecond) // let the redelivery wait for tx
	if err := a.CompleteTx(ctx, tx, id); err != nil {
		t.Fatalf("CompleteTx while the step is redelivered: %v", err)
	}
	f.commit(t, tx)
	if err := <-done; err != nil {
		t.Fatalf("redelivered steps: %v", err)
	}
	f.mustEffects(t, id, "step-1", 1)
	f.mustEffects(t, id, "step-2", 1)
	if s := mustGet(t, a, id); s.State != saga.Completed {
		t.Errorf("state %s; want completed", s.State)
	}
}

// TestTwoReplicas runs the Race scenarios with their two Coordinators on
// two drivers of one database: two pools on PostgreSQL, two connections
// (two processes, as far as SQLite's locking goes) on SQLite.
func TestTwoReplicas(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		f := setupSQLite(t)
		drv, err := sqlitedriver.Open(childTarget(f.childEnv), nil)
		if err != nil {
			t.Fatalf("sqlitedriver.Open: %v", err)
		}
		t.Cleanup(func() { _ = drv.Close() })
		f.replica = drv
		runRaces(t, f)
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		testdb.RequirePostgres(t)
		f := setupPostgres(t)
		schema := childTarget(f.childEnv)
		f.replica = pgDriver(t, testdb.Pool(t, schema, 8), schema)
		runRaces(t, f)
	})
}

// childTarget is the database a fixture's crash children are told to use
// (the SQLite file, the PostgreSQL schema).
func childTarget(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, envTarget+"="); ok {
			return v
		}
	}
	return ""
}

func runRaces[TTx any](t *testing.T, f *fixture[TTx]) {
	for _, sc := range scenarios[TTx]() {
		if strings.HasPrefix(sc.name, "Race/") {
			t.Run(sc.name, func(t *testing.T) { sc.fn(t, f) })
		}
	}
}

// A forward step that failed in a transaction that stays open (StepTx
// rolled back to its savepoint) holds nothing on the saga: on PostgreSQL
// a Compensate on another replica goes through at once, and the
// transaction, still usable, is refused the step afterwards. (On SQLite
// the open transaction holds the database's write lock.)
func TestPostgresFailedStepHoldsNothing(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testFailedStepHoldsNothing(t, setupPostgres(t))
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		testFailedStepHoldsNothing(t, setupPostgresSQL(t))
	})
}

func testFailedStepHoldsNothing[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	a, b := f.coordinator(t, nil), f.replicaCoordinator(t)
	id := newSagaID(t)
	f.start(t, a, id)
	run(t, a, id, "step-1", f.apply(id, "step-1"), true)
	tx := f.begin(t)
	_, _, err := a.StepTx(ctx, tx, id, "step-2", func(ctx context.Context, tx TTx) ([]byte, error) {
		if _, err := f.apply(id, "step-2")(ctx, tx); err != nil {
			return nil, err
		}
		return nil, errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("failing StepTx: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.Compensate(cctx, id, f.compensations(t, id, stepsN(2))); err != nil {
		t.Fatalf("Compensate while the failed step's transaction is open: %v", err)
	}
	if _, _, err := a.StepTx(ctx, tx, id, "step-2", f.apply(id, "step-2")); !errors.Is(err, saga.ErrState) {
		t.Errorf("StepTx after the saga was compensated: %v; want a *StateError", err)
	}
	f.commit(t, tx)
	f.wantCompensated(t, a, id, 2)
}
