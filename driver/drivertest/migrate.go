package drivertest

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

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

// Before Migrate, idem's statements fail with driver.ErrNotMigrated, in a
// message that names the missing table and says to run Migrate: what an
// operator who forgot to migrate reads in the log.
func testNotMigratedError[TTx any](t *testing.T, newUnmigrated func(t *testing.T) driver.Driver[TTx]) {
	drv := newUnmigrated(t)
	ctx := t.Context()
	check := func(what, table string, err error) {
		t.Helper()
		if !errors.Is(err, driver.ErrNotMigrated) {
			t.Errorf("%s on an unmigrated database: %v; want driver.ErrNotMigrated", what, err)
			return
		}
		if msg := err.Error(); !strings.Contains(msg, table) || !strings.Contains(msg, "Migrate") {
			t.Errorf("%s: %q; want it to name the table %q and Migrate", what, msg, table)
		}
	}
	_, err := drv.Executor().RecordClaim(ctx, claimAt("key-probe", fpA, newToken(), t0))
	check("RecordClaim", "idempotency_record", err)
	_, err = drv.Executor().InboxInsert(ctx, &driver.InboxInsertParams{Consumer: "c", IDs: []uuid.UUID{uuid.New()}, Now: t0})
	check("InboxInsert", "processed_event", err)

	// In a transaction (the relay's claim, idemhttp's ModeTx claim).
	tx := begin(t, drv)
	_, err = drv.UnwrapExecutor(tx).OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: t0, Limit: 1})
	check("OutboxClaimBatch", "outbox", err)
	if err := drv.Rollback(ctx, tx); err != nil { // SQLite: one writer at a time
		t.Fatalf("Rollback: %v", err)
	}
	tx = begin(t, drv)
	_, err = drv.UnwrapExecutor(tx).RecordClaim(ctx, claimAt("key-probe", fpA, newToken(), t0))
	check("RecordClaim in a transaction", "idempotency_record", err)
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
