package pgsqldriver_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

// The context of a transaction of Begin is dropped when the driver ends it
// (Commit, Rollback), and, when its caller ended it itself (a *sql.Tx's
// own Commit or Rollback), once the transaction is collected: nothing is
// kept per transaction, also on a context that never ends.
func TestTxContextsDropped(t *testing.T) {
	t.Parallel()
	drv := testdb.PostgresSQL(t)
	ctx := t.Context()
	for i := range 50 {
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch i % 4 {
		case 0:
			err = drv.Commit(ctx, tx)
		case 1:
			err = drv.Rollback(ctx, tx)
		case 2:
			err = tx.Commit()
		case 3:
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := pgsqldriver.OpenTxContexts(drv); n > 25 {
		t.Fatalf("%d transaction contexts registered after 25 ended by the driver", n)
	}
	for deadline := time.Now().Add(10 * time.Second); pgsqldriver.OpenTxContexts(drv) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d transaction contexts still registered after their transactions were collected", pgsqldriver.OpenTxContexts(drv))
		}
		runtime.GC()
	}
}

// Begin reports its context's own error, as database/sql's BeginTx does:
// a deadline that passed while it waited for a connection is
// context.DeadlineExceeded (not the context.Canceled of the context the
// driver begins on), and a context already ended begins nothing.
func TestBeginReportsItsContextsError(t *testing.T) {
	t.Parallel()
	db, schema := testdb.SQLDB(t, 1)
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	held, err := drv.Begin(t.Context()) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drv.Rollback(context.Background(), held) }()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if tx, err := drv.Begin(ctx); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			_ = drv.Rollback(context.Background(), tx)
		}
		t.Fatalf("Begin waiting for a connection past its deadline: %v, want context.DeadlineExceeded", err)
	}
	if err := drv.Rollback(t.Context(), held); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if tx, err := drv.Begin(ctx); !errors.Is(err, context.DeadlineExceeded) {
			if err == nil {
				_ = drv.Rollback(context.Background(), tx)
			}
			t.Fatalf("Begin on an ended context: %v, want context.DeadlineExceeded", err)
		}
	}
}
