package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
)

// A transaction that recorded the event and wrote its effect, then rolled
// back (the host lost its work before COMMIT), leaves nothing; the
// redelivery applies the event once.
func testCrashRolledBack[TTx any](t *testing.T, f *fixture[TTx]) {
	ctx := t.Context()
	ib := f.inbox(t, consumer)
	id := newID(t)
	tx := begin(t, f)
	if applied, err := ib.ProcessTx(ctx, tx, id, f.apply(consumer, id)); err != nil || !applied {
		t.Fatalf("ProcessTx = %v, %v; want applied", applied, err)
	}
	if err := f.drv.Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	f.mustEffects(t, consumer, id, 0)
	f.mustProcessed(t, consumer, id, 0)
	mustProcess(t, ib, id, f.apply(consumer, id), true)
	mustProcess(t, ib, id, f.apply(consumer, id), false)
	f.mustEffects(t, consumer, id, 1)
}

// The connection of the applying transaction is killed after the effect and
// the dedup row were written, before COMMIT: Process reports an error,
// nothing was committed, the redelivery applies the event once.
func testCrashConnectionKilled[TTx any](t *testing.T, f *fixture[TTx]) {
	if f.kill == nil {
		t.Skip("the backend has no connection to kill; see Crash/ProcessExitsBeforeCommit")
	}
	ib := f.inbox(t, consumer)
	id := newID(t)
	applied, err := ib.Process(t.Context(), id, func(ctx context.Context, tx TTx) error {
		if err := f.effect(ctx, tx, consumer, id); err != nil {
			return err
		}
		f.kill(t, tx)
		return nil
	})
	if err == nil || applied {
		t.Fatalf("Process whose connection died before COMMIT = %v, %v; want an error", applied, err)
	}
	var ee *inbox.EventError
	if errors.As(err, &ee) {
		t.Errorf("error %v is an *EventError; the handler did not fail, the commit did", err)
	}
	f.mustEffects(t, consumer, id, 0)
	f.mustProcessed(t, consumer, id, 0)
	mustProcess(t, ib, id, f.apply(consumer, id), true)
	mustProcess(t, ib, id, f.apply(consumer, id), false)
	f.mustEffects(t, consumer, id, 1)
}

// A child process applies an event and dies (os.Exit) after writing the
// effect and the dedup row, before COMMIT. The database keeps neither; the
// redelivery applies the event once.
func testCrashProcessExit[TTx any](t *testing.T, f *fixture[TTx]) {
	ib := f.inbox(t, consumer)
	id := newID(t)
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), f.childEnv...)
	cmd.Env = append(cmd.Env, envEvent+"="+id.String())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != childExitCode || !strings.Contains(string(out), childWrote) {
		t.Fatalf("child process: %v; want it to write and exit with %d before COMMIT; output:\n%s", err, childExitCode, out)
	}
	f.mustEffects(t, consumer, id, 0)
	f.mustProcessed(t, consumer, id, 0)
	mustProcess(t, ib, id, f.apply(consumer, id), true)
	mustProcess(t, ib, id, f.apply(consumer, id), false)
	f.mustEffects(t, consumer, id, 1)
}

// Environment of the crash child.
const (
	envBackend    = "IDEM_INBOX_CRASH_BACKEND" // "postgres" or "sqlite"
	envTarget     = "IDEM_INBOX_CRASH_TARGET"  // PostgreSQL schema or SQLite path
	envEvent      = "IDEM_INBOX_CRASH_EVENT"
	childExitCode = 7
	childWrote    = "effect and dedup row written, crashing before COMMIT"
)

// TestCrashChild is the crashing process of Crash/ProcessExitsBeforeCommit;
// it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	backend := os.Getenv(envBackend)
	if backend == "" {
		t.Skip("run by Crash/ProcessExitsBeforeCommit only")
	}
	ctx := context.Background()
	id := uuid.MustParse(os.Getenv(envEvent))
	target := os.Getenv(envTarget)
	crash := func() {
		fmt.Println(childWrote)
		os.Exit(childExitCode)
	}
	switch backend {
	case "postgres":
		pool := testdb.Pool(t, target, 2)
		ib, err := inbox.New(pgDriver(t, pool, target), &inbox.Config{Consumer: consumer})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ib.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
			if err := pgEffect(ctx, tx, consumer, id); err != nil {
				return err
			}
			crash()
			return nil
		})
		t.Fatalf("Process returned: %v", err)
	case "sqlite":
		drv, err := sqlitedriver.Open(target, nil)
		if err != nil {
			t.Fatal(err)
		}
		ib, err := inbox.New(drv, &inbox.Config{Consumer: consumer})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ib.Process(ctx, id, func(ctx context.Context, tx *sql.Tx) error {
			if err := sqliteEffect(ctx, tx, consumer, id); err != nil {
				return err
			}
			crash()
			return nil
		})
		t.Fatalf("Process returned: %v", err)
	default:
		t.Fatalf("unknown backend %q", backend)
	}
}
