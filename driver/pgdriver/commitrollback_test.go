package pgdriver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
)

// A COMMIT of a transaction that a failed statement aborted (its error
// ignored) comes back as ROLLBACK: Commit says nothing was committed
// (driver.ErrTxAborted), keeping pgx's error in the chain.
func TestCommitOfAbortedTxIsErrTxAborted(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
		t.Fatal("1/0 did not fail")
	}
	err = drv.Commit(ctx, tx)
	if !errors.Is(err, driver.ErrTxAborted) || !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit = %v; want driver.ErrTxAborted wrapping pgx.ErrTxCommitRollback", err)
	}
}

// A deferred constraint that fails at COMMIT: the database refused the
// commit, nothing was committed (driver.ErrTxAborted), and the
// constraint's error stays in the chain.
func TestCommitRefusedByDeferredConstraintIsErrTxAborted(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TEMP TABLE parent (id int PRIMARY KEY) ON COMMIT DROP`,
		`CREATE TEMP TABLE child (pid int REFERENCES parent DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP`,
		`INSERT INTO child VALUES (1)`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	err = drv.Commit(ctx, tx)
	var st interface{ SQLState() string }
	if !errors.Is(err, driver.ErrTxAborted) || !errors.As(err, &st) || st.SQLState() != "23503" {
		t.Fatalf("Commit = %v; want driver.ErrTxAborted wrapping the foreign key violation (23503)", err)
	}
}

// A transaction whose session PostgreSQL ended (pg_terminate_backend: a
// restart, a failover, an operator) is over: the server rolled it back.
// Rollback and RollbackEnded say so without an error, whether a statement
// already found the connection closed or the ROLLBACK is the first to hear
// of it (FATAL 57P01), for Begin's transactions and BeginClaim's: the
// callers (idemhttp, inbox, saga) logged "rollback failed" for each killed
// connection, a second line for a failure already reported.
func TestRollbackOfKilledSessionIsNotAnError(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	pool := drv.Pool()
	begins := map[string]func(t *testing.T) pgx.Tx{
		"Begin": func(t *testing.T) pgx.Tx {
			tx, err := drv.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return tx
		},
		"BeginClaim": func(t *testing.T) pgx.Tx {
			tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: t.Name(), Now: time.Now()})
			if err != nil || !res.Locked {
				t.Fatalf("BeginClaim = %v, %v; want locked", res, err)
			}
			return tx
		},
	}
	rollbacks := map[string]func(pgx.Tx) error{
		"Rollback":      func(tx pgx.Tx) error { return drv.Rollback(ctx, tx) },
		"RollbackEnded": func(tx pgx.Tx) error { return drv.RollbackEnded(ctx, tx) },
	}
	for bname, begin := range begins {
		for rname, rollback := range rollbacks {
			for _, seen := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/statement_after_kill=%v", bname, rname, seen), func(t *testing.T) {
					tx := begin(t)
					if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
						t.Fatal(err)
					}
					testdb.Terminate(t, pool, tx)
					if seen {
						if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
							t.Fatal("a statement on the killed session succeeded")
						}
					}
					if err := rollback(tx); err != nil {
						t.Errorf("%s of a transaction whose session the server ended = %v; want nil (it is over)", rname, err)
					}
				})
			}
		}
	}
	// A ROLLBACK that did not run on a live session (its context ended:
	// the server holds the transaction until it sees the connection
	// closed) is still an error.
	live, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := drv.Rollback(ended, live); err == nil {
		t.Error("Rollback with its context ended on a live session = nil; want its error")
	}
	// A transaction that ended otherwise is still told apart.
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := drv.RollbackEnded(ctx, tx); !errors.Is(err, driver.ErrTxDone) {
		t.Errorf("RollbackEnded after Commit = %v; want driver.ErrTxDone", err)
	}
}
