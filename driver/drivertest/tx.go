package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

func testName[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	if name := newDriver(t).Name(); name == "" {
		t.Fatal("Name() is empty")
	}
}

// begin starts a transaction that is rolled back when the test ends, unless
// the test ended it.
func begin[TTx any](t *testing.T, drv driver.Driver[TTx]) TTx {
	t.Helper()
	tx, err := drv.Begin(t.Context())
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	t.Cleanup(func() { _ = drv.Rollback(context.Background(), tx) })
	return tx
}

func commit[TTx any](t *testing.T, drv driver.Driver[TTx], tx TTx) {
	t.Helper()
	if err := drv.Commit(t.Context(), tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func rollback[TTx any](t *testing.T, drv driver.Driver[TTx], tx TTx) {
	t.Helper()
	if err := drv.Rollback(t.Context(), tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
}

// A claim made in a transaction that rolls back (the handler's business
// write failed) leaves nothing: the retry claims the key.
func testRollbackOfClaim[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	tx := begin(t, drv)
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, drv.UnwrapExecutor(tx), p)
	c := completeParams(p, 201, nil, []byte("never committed"))
	complete(t, drv.UnwrapExecutor(tx), c)
	mustGet(t, drv.UnwrapExecutor(tx), testScope, "key-1", completed(p, c))
	rollback(t, drv, tx)

	ex := drv.Executor()
	mustNotFind(t, ex, testScope, "key-1")
	q := claimAt("key-1", fpB, newToken(), t0.Add(time.Second))
	mustClaim(t, ex, q)
	mustGet(t, ex, testScope, "key-1", inProgress(q))
}

// A completion in a transaction that rolls back leaves the committed claim
// as it was: still in progress and still owned by the same token.
func testRollbackOfComplete[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ex := drv.Executor()
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, ex, p)

	tx := begin(t, drv)
	complete(t, drv.UnwrapExecutor(tx), completeParams(p, 201, nil, []byte("rolled back")))
	rollback(t, drv, tx)
	mustGet(t, ex, testScope, "key-1", inProgress(p))

	tx = begin(t, drv)
	c := completeParams(p, 201, nil, []byte("committed"))
	complete(t, drv.UnwrapExecutor(tx), c)
	commit(t, drv, tx)
	mustGet(t, ex, testScope, "key-1", completed(p, c))
}

func testRollbackAfterCommit[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	tx := begin(t, drv)
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, drv.UnwrapExecutor(tx), p)
	commit(t, drv, tx)
	if err := drv.Rollback(t.Context(), tx); err != nil {
		t.Errorf("Rollback after Commit: %v; want nil", err)
	}
	tx = begin(t, drv)
	rollback(t, drv, tx)
	if err := drv.Rollback(t.Context(), tx); err != nil {
		t.Errorf("second Rollback: %v; want nil", err)
	}
	mustGet(t, drv.Executor(), testScope, "key-1", inProgress(p))
}

// driver.EndedRollbacker, for backends that implement it: RollbackEnded
// rolls an open transaction back (nil), and reports one already committed
// or rolled back with driver.ErrTxDone (not driver.ErrTxAborted: Begin's
// transaction committed).
func testRollbackEnded[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	er, ok := drv.(driver.EndedRollbacker[TTx])
	if !ok {
		t.Skipf("%s does not implement driver.EndedRollbacker (optional)", drv.Name())
	}
	tx := begin(t, drv)
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, drv.UnwrapExecutor(tx), p)
	if err := er.RollbackEnded(t.Context(), tx); err != nil {
		t.Fatalf("RollbackEnded of an open transaction: %v; want nil", err)
	}
	mustNotFind(t, drv.Executor(), testScope, "key-1")
	if err := er.RollbackEnded(t.Context(), tx); !errors.Is(err, driver.ErrTxDone) {
		t.Errorf("RollbackEnded after RollbackEnded: %v; want driver.ErrTxDone", err)
	}

	tx = begin(t, drv)
	mustClaim(t, drv.UnwrapExecutor(tx), p)
	commit(t, drv, tx)
	err := er.RollbackEnded(t.Context(), tx)
	if !errors.Is(err, driver.ErrTxDone) || errors.Is(err, driver.ErrTxAborted) {
		t.Errorf("RollbackEnded after Commit: %v; want driver.ErrTxDone, not driver.ErrTxAborted", err)
	}
	mustGet(t, drv.Executor(), testScope, "key-1", inProgress(p))
}

// Migrating an up-to-date database changes nothing and loses nothing.
func testMigrateTwice[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, drv.Executor(), p)
	c := completeParams(p, 200, nil, []byte("kept"))
	complete(t, drv.Executor(), c)

	for i := range 2 {
		if err := drv.Migrate(ctx); err != nil {
			t.Fatalf("Migrate #%d on a migrated database: %v", i+2, err)
		}
	}
	tx := begin(t, drv)
	if err := drv.MigrateTx(ctx, tx); err != nil {
		t.Fatalf("MigrateTx on a migrated database: %v", err)
	}
	commit(t, drv, tx)

	mustGet(t, drv.Executor(), testScope, "key-1", completed(p, c))
	mustClaim(t, drv.Executor(), claimAt("key-2", fpA, newToken(), t0))
}
