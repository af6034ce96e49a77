package drivertest

import (
	"sync"
	"testing"

	"github.com/idemkit/idem/driver"
)

// claimFails checks that idem's tables do not exist: a claim errors.
func claimFails(t *testing.T, ex driver.Executor, when string) {
	t.Helper()
	res, err := ex.RecordClaim(t.Context(), claimAt("key-probe", fpA, newToken(), t0))
	if err == nil {
		t.Fatalf("%s: RecordClaim succeeded (Claimed=%v); want an error, idem's tables should not exist", when, res.Claimed)
	}
}

func testNoTablesBeforeMigrate[TTx any](t *testing.T, newUnmigrated func(t *testing.T) driver.Driver[TTx]) {
	drv := newUnmigrated(t)
	claimFails(t, drv.Executor(), "before any migration")
}

// MigrateTx joins the caller's transaction: rolled back, no tables remain;
// committed, idem works.
func testMigrateTxRollbackThenCommit[TTx any](t *testing.T, newUnmigrated func(t *testing.T) driver.Driver[TTx]) {
	drv := newUnmigrated(t)
	ctx := t.Context()

	tx := begin(t, drv)
	if err := drv.MigrateTx(ctx, tx); err != nil {
		t.Fatalf("MigrateTx: %v", err)
	}
	// The tables exist inside the transaction.
	mustClaim(t, drv.UnwrapExecutor(tx), claimAt("key-1", fpA, newToken(), t0))
	rollback(t, drv, tx)
	claimFails(t, drv.Executor(), "after MigrateTx was rolled back")

	tx = begin(t, drv)
	if err := drv.MigrateTx(ctx, tx); err != nil {
		t.Fatalf("MigrateTx after a rolled-back MigrateTx: %v", err)
	}
	commit(t, drv, tx)
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, drv.Executor(), p)

	if err := drv.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after MigrateTx: %v", err)
	}
	mustGet(t, drv.Executor(), testScope, "key-1", inProgress(p))
}

func testMigrateThenMigrateTx[TTx any](t *testing.T, newUnmigrated func(t *testing.T) driver.Driver[TTx]) {
	drv := newUnmigrated(t)
	ctx := t.Context()
	if err := drv.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	p := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, drv.Executor(), p)
	if err := drv.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	tx := begin(t, drv)
	if err := drv.MigrateTx(ctx, tx); err != nil {
		t.Fatalf("MigrateTx after Migrate: %v", err)
	}
	commit(t, drv, tx)
	mustGet(t, drv.Executor(), testScope, "key-1", inProgress(p))
}

// Replicas starting together all migrate without error.
func testConcurrentMigrate[TTx any](t *testing.T, drvs []driver.Driver[TTx]) {
	drv := drvs[0]
	const replicas = 5
	errs := make([]error, replicas)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			<-start
			errs[i] = drvs[i%len(drvs)].Migrate(t.Context())
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Migrate #%d: %v", i, err)
		}
	}
	mustClaim(t, drv.Executor(), claimAt("key-1", fpA, newToken(), t0))
}
