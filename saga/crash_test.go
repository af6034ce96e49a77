package saga_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/saga"
)

// Environment of the crash child.
const (
	envBackend    = "IDEM_SAGA_CRASH_BACKEND" // "postgres" or "sqlite"
	envTarget     = "IDEM_SAGA_CRASH_TARGET"  // PostgreSQL schema or SQLite path
	envSaga       = "IDEM_SAGA_CRASH_SAGA"
	envMode       = "IDEM_SAGA_CRASH_MODE" // "step" or "compensate"
	childExitCode = 7
	childWrote    = "effect and step record written, crashing before COMMIT"
)

// runChild runs TestCrashChild in a new process that must die before COMMIT.
func (f *fixture[TTx]) runChild(t *testing.T, sagaID, mode string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), f.childEnv...)
	cmd.Env = append(cmd.Env, envSaga+"="+sagaID, envMode+"="+mode)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != childExitCode || !strings.Contains(string(out), childWrote) {
		t.Fatalf("child process: %v; want it to write and exit with %d before COMMIT; output:\n%s", err, childExitCode, out)
	}
}

// A child process runs a step and dies (os.Exit) after the step's effect,
// before COMMIT. Neither the effect nor the step record remains; the retry
// runs the step once.
func testCrashStep[TTx any](t *testing.T, f *fixture[TTx]) {
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	f.runChild(t, id, "step")
	f.mustEffects(t, id, "step-1", 0)
	if s := mustGet(t, c, id); s.Done("step-1") || s.State != saga.Running {
		t.Fatalf("after the crash: %s, steps %v; want running, step-1 not done", s.State, stepNames(s))
	}
	run(t, c, id, "step-1", f.apply(id, "step-1"), true)
	run(t, c, id, "step-1", f.apply(id, "step-1"), false)
	f.mustEffects(t, id, "step-1", 1)
}

// A child process compensates a saga and dies inside the second
// compensation, after its effect, before COMMIT. The saga stays
// compensating with the first compensation recorded; a restarted process
// finds it (List) and resumes: every compensation takes effect once.
func testCrashCompensation[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	c := f.coordinator(t, nil)
	id := f.runUntilFailure(t, c, 4)
	f.runChild(t, id, "compensate")
	f.mustLog(t, id, "step-1", "step-2", "step-3", "compensate:step-3")
	if got := listed(t, c, id); got == nil || got.State != saga.Compensating {
		t.Fatalf("List after the crash has %+v; want the compensating saga", got)
	}
	if _, err := c.Resume(ctx, id, f.compensations(t, id, stepsN(4))); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	f.wantCompensated(t, c, id, 4)
}

// The database connection of a step's transaction is killed after the
// effect, before COMMIT: Step fails, nothing remains, the retry runs the
// step once.
func testCrashConnectionKilled[TTx any](t *testing.T, f *fixture[TTx]) {
	if f.kill == nil {
		t.Skip("the backend has no connection to kill; see Crash/ProcessExitsBeforeCommit")
	}
	c := f.coordinator(t, nil)
	id := newSagaID(t)
	f.start(t, c, id)
	_, ran, err := c.Step(t.Context(), id, "step-1", func(ctx context.Context, tx TTx) ([]byte, error) {
		res, err := f.apply(id, "step-1")(ctx, tx)
		if err != nil {
			return nil, err
		}
		f.kill(t, tx)
		return res, nil
	})
	if err == nil || ran {
		t.Fatalf("Step whose connection died before COMMIT = %v, %v; want an error", ran, err)
	}
	f.mustEffects(t, id, "step-1", 0)
	run(t, c, id, "step-1", f.apply(id, "step-1"), true)
	run(t, c, id, "step-1", f.apply(id, "step-1"), false)
	f.mustEffects(t, id, "step-1", 1)
}

// TestCrashChild is the crashing process of the Crash scenarios; it does
// nothing in a normal run.
func TestCrashChild(t *testing.T) {
	backend := os.Getenv(envBackend)
	if backend == "" {
		t.Skip("run by the Crash scenarios only")
	}
	target := os.Getenv(envTarget)
	switch backend {
	case "postgres":
		pool := testdb.Pool(t, target, 2)
		crashChild(t, driver.Driver[pgx.Tx](pgDriver(t, pool, target)), pgEffect)
	case "sqlite":
		drv, err := sqlitedriver.Open(target, nil)
		if err != nil {
			t.Fatal(err)
		}
		crashChild(t, driver.Driver[*sql.Tx](drv), sqliteEffect)
	default:
		t.Fatalf("unknown backend %q", backend)
	}
}

func crashChild[TTx any](t *testing.T, drv driver.Driver[TTx], effect func(ctx context.Context, tx TTx, sagaID, step string) error) {
	ctx := context.Background()
	id := os.Getenv(envSaga)
	c, err := saga.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	crashAfter := func(ctx context.Context, tx TTx, step string) {
		if err := effect(ctx, tx, id, step); err != nil {
			t.Fatalf("effect: %v", err)
		}
		fmt.Println(childWrote)
		os.Exit(childExitCode)
	}
	switch mode := os.Getenv(envMode); mode {
	case "step":
		_, _, err = c.Step(ctx, id, "step-1", func(ctx context.Context, tx TTx) ([]byte, error) {
			crashAfter(ctx, tx, "step-1")
			return nil, nil
		})
	case "compensate":
		undo := func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
			if fwd.Name == "step-2" {
				crashAfter(ctx, tx, saga.CompensationName(fwd.Name))
			}
			return []byte("undone " + fwd.Name), effect(ctx, tx, id, saga.CompensationName(fwd.Name))
		}
		err = c.Compensate(ctx, id, saga.Compensations[TTx]{"step-1": undo, "step-2": undo, "step-3": undo})
	default:
		t.Fatalf("unknown mode %q", mode)
	}
	t.Fatalf("returned without crashing: %v", err)
}
