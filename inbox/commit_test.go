package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/txbegin"
)

// A COMMIT that hangs (here a deferred trigger sleeping, as a stalled
// server or network would) must not block Process for ever once its
// context ended: the effects in flight get a grace period to commit, then
// the COMMIT is cancelled and Process reports the unknown outcome.
func TestHungCommitEndsAfterCancel(t *testing.T) {
	t.Parallel()
	testHungCommit(t, func(ctx context.Context) context.Context { return ctx })
}

// A context carrying a stop context (txbegin.WithStop, as an idemkafka
// consumer's handler gets) may still end on its own, before the stop: a
// handler processing another inbox with a deadline of its own, say. Its
// COMMIT then gets the grace period from that end too, not only from the
// stop.
func TestHungCommitEndsAfterCancelBeforeStop(t *testing.T) {
	t.Parallel()
	testHungCommit(t, func(ctx context.Context) context.Context {
		stop, stopNow := context.WithCancel(ctx) // never ends before the end of the test
		t.Cleanup(stopNow)
		return txbegin.WithStop(context.WithoutCancel(stop), stop)
	})
}

// testHungCommit runs Process on a context derived from parent(test
// context), cancels it from inside the handler after writing a row whose
// COMMIT hangs, and checks that Process gives up after the grace period,
// applying nothing.
func testHungCommit(t *testing.T, parent func(context.Context) context.Context) {
	testdb.RequirePostgres(t)
	f := setupPostgres(t)
	ctx := t.Context()
	tx := begin(t, f)
	testdb.SlowCommit(t, func(q string) error { _, err := tx.Exec(ctx, q); return err })
	commit(t, f, tx)

	ib := f.inbox(t, "billing")
	id := newID(t)
	pctx, cancel := context.WithCancel(parent(ctx))
	defer cancel()
	var cancelled time.Time
	applied, err := ib.Process(pctx, id, func(ctx context.Context, tx pgx.Tx) error {
		if err := f.effect(ctx, tx, "billing", id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO slow_commit VALUES (1)`); err != nil {
			return err
		}
		cancel() // the caller's end; the COMMIT will hang
		cancelled = time.Now()
		return nil
	})
	if waited := time.Since(cancelled); waited > 20*time.Second {
		t.Errorf("Process returned %s after its context ended; want the COMMIT cancelled after a grace period", waited.Round(time.Second))
	}
	if applied || err == nil {
		t.Fatalf("Process with a hung COMMIT = %v, %v; want an error", applied, err)
	}
	f.mustEffects(t, "billing", id, 0)
	f.mustProcessed(t, "billing", id, 0)
}

// A handler that ignores the error of a failed statement and returns nil
// leaves PostgreSQL's transaction aborted: its COMMIT is a ROLLBACK. The
// error must say that nothing was applied (driver.ErrTxAborted), not that
// the outcome is unknown.
func TestCommitRolledBackSaysNothingApplied(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	f := setupPostgres(t)
	ib := f.inbox(t, "billing")
	id := newID(t)
	applied, err := ib.Process(t.Context(), id, func(ctx context.Context, tx pgx.Tx) error {
		if err := f.effect(ctx, tx, "billing", id); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, `SELECT 1/0`) // the mistake: the error is dropped
		return nil
	})
	if applied || !errors.Is(err, driver.ErrTxAborted) {
		t.Fatalf("Process = %v, %v; want not applied, driver.ErrTxAborted", applied, err)
	}
	if msg := err.Error(); strings.Contains(msg, "outcome unknown") || !strings.Contains(msg, "nothing applied") {
		t.Errorf("error %q; want it to say nothing was applied, not that the outcome is unknown", msg)
	}
	f.mustEffects(t, "billing", id, 0)
	f.mustProcessed(t, "billing", id, 0)
}
