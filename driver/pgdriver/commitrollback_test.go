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
