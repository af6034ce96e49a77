package pgdriver_test

import (
	"errors"
	"testing"

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
