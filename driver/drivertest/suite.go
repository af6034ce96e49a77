package drivertest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/idemkit/idem/driver"
)

// Backend is what the suite needs of a backend under test. Every function
// registers its own cleanup with t and must return an isolated database (a
// fresh PostgreSQL schema, a fresh SQLite file) each time it is called:
// every subtest runs in parallel with the others.
type Backend[TTx any] struct {
	// New returns a fresh, migrated driver on its own database. Required.
	New func(t *testing.T) driver.Driver[TTx]
	// NewUnmigrated returns a driver on a fresh database on which neither
	// Migrate nor MigrateTx has run. Required.
	NewUnmigrated func(t *testing.T) driver.Driver[TTx]
	// Reopen returns another driver on drv's database, with connections
	// of its own, as another process (or replica) would open it. The
	// concurrency subtests (concurrent claims, takeovers, lease
	// acquisitions and migrations) spread their callers over drv and two
	// reopened drivers, so that a backend whose driver serialises its own
	// callers (SQLite's single connection) is still raced against others.
	// Optional: without it they all use drv, which is enough for a driver
	// on a pool of connections.
	Reopen func(t *testing.T, drv driver.Driver[TTx]) driver.Driver[TTx]
}

// Run runs the whole shared suite against b: records, inbox, outbox and
// relay, leases, sagas, the retention deletes' batches and migrations. (The cleaner's tests, which run
// package cleanup on both idem backends, live in package cleanup.) What a backend's Caps say
// it cannot do (concurrent writers) and the optional interfaces it does not
// implement (driver.TxClaimer, driver.EndedRollbacker) decide which
// subtests are skipped; nothing else is optional.
func Run[TTx any](t *testing.T, b Backend[TTx]) {
	t.Helper()
	if b.New == nil || b.NewUnmigrated == nil {
		t.Fatal("drivertest: Backend.New and NewUnmigrated are required")
	}
	runRecords(t, b.New, b.Reopen)
	runInbox(t, b.New)
	runOutbox(t, b.New)
	runLock(t, b.New, b.Reopen)
	runSaga(t, b.New)
	runRetention(t, b.New)
	runMigrate(t, b.NewUnmigrated, b.Reopen)
}

// runRecords runs the record semantics and the concurrency subtests.
func runRecords[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx], reopen reopener[TTx]) {
	t.Helper()

	// Record semantics, each through the three ways an executor is used.
	t.Run("Record", func(t *testing.T) {
		t.Parallel()
		for _, sc := range recordScenarios {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				for _, m := range execModes {
					t.Run(m, func(t *testing.T) {
						t.Parallel()
						runScenario(t, newDriver, m, sc)
					})
				}
			})
		}
	})

	tests := []struct {
		name string
		fn   func(t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx])
	}{
		{"Name", testName[TTx]},
		{"Stores", testStores[TTx]},
		{"RollbackOfClaimLeavesNoRecord", testRollbackOfClaim[TTx]},
		{"RollbackOfCompleteKeepsClaim", testRollbackOfComplete[TTx]},
		{"RollbackAfterCommitIsNotAnError", testRollbackAfterCommit[TTx]},
		{"RollbackEnded", testRollbackEnded[TTx]},
		{"CancelledStatementLeavesTxAllOrNothing", testCancelledStatement[TTx]},
		{"MigrateTwiceIsNoOp", testMigrateTwice[TTx]},
		{"ConcurrentClaimsOneWinner", withPeers(testConcurrentClaims[TTx], reopen)},
		{"ConcurrentTakeoverOneWinner", withPeers(testConcurrentTakeover[TTx], reopen)},
		{"ConcurrentTx/SecondWaitsForCommit", testTxWaitsForCommit[TTx]},
		{"ConcurrentTx/SecondClaimsAfterRollback", testTxClaimsAfterRollback[TTx]},
		{"ConcurrentTx/ExecutorWaitsForCommit", testExecutorWaitsForCommit[TTx]},
		{"ConcurrentTx/LockTimeout", testLockTimeout[TTx]},
		{"TxClaimer", testTxClaim[TTx]},
		{"TxClaimer/Now", testTxClaimNow[TTx]},
		{"Clock", testClock[TTx]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newDriver)
		})
	}
}

// reopener is Backend.Reopen.
type reopener[TTx any] func(t *testing.T, drv driver.Driver[TTx]) driver.Driver[TTx]

// peers returns the drivers a concurrency subtest spreads its callers
// over: drv, and two more on its database if the backend can reopen it.
func peers[TTx any](t *testing.T, drv driver.Driver[TTx], reopen reopener[TTx]) []driver.Driver[TTx] {
	t.Helper()
	out := []driver.Driver[TTx]{drv}
	if reopen != nil {
		out = append(out, reopen(t, drv), reopen(t, drv))
	}
	return out
}

// withPeers adapts a concurrency subtest, which takes the drivers its
// callers use (the first one also does the checks), to the suite's form.
func withPeers[TTx any](fn func(t *testing.T, drvs []driver.Driver[TTx]), reopen reopener[TTx]) func(t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	return func(t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
		fn(t, peers(t, newDriver(t), reopen))
	}
}

// runMigrate runs the migration tests. newUnmigrated must return a driver on
// a fresh database on which neither Migrate nor MigrateTx has run yet.
func runMigrate[TTx any](t *testing.T, newUnmigrated func(t *testing.T) driver.Driver[TTx], reopen reopener[TTx]) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx])
	}{
		{"NoTablesBeforeMigrate", testNoTablesBeforeMigrate[TTx]},
		{"NotMigratedError", testNotMigratedError[TTx]},
		{"MigrateTxRollbackThenCommit", testMigrateTxRollbackThenCommit[TTx]},
		{"MigrateThenMigrateTx", testMigrateThenMigrateTx[TTx]},
		{"ConcurrentMigrate", withPeers(testConcurrentMigrate[TTx], reopen)},
	}
	t.Run("Migrate", func(t *testing.T) {
		t.Parallel()
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				tt.fn(t, newUnmigrated)
			})
		}
	})
}

// Ways a scenario reaches the database.
const (
	modeExecutor   = "Executor"   // drv.Executor(), each statement commits
	modeTxCommit   = "TxCommit"   // drv.UnwrapExecutor(tx), then Commit
	modeTxRollback = "TxRollback" // drv.UnwrapExecutor(tx), then Rollback
)

var execModes = []string{modeExecutor, modeTxCommit, modeTxRollback}

// scenario is a record test written against an Executor only, so it runs
// unchanged in every mode. Each run starts on an empty database.
type scenario struct {
	name string
	run  func(t *testing.T, ex driver.Executor)
}

// runScenario runs sc in mode m. In the transaction modes it then checks what
// a user outside the transaction sees: after Commit, exactly the records the
// transaction saw last; after Rollback, none of them.
func runScenario[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx], m string, sc scenario) {
	drv := newDriver(t)
	if m == modeExecutor {
		sc.run(t, drv.Executor())
		return
	}

	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	// Registered after newDriver's cleanup, so it runs first: the
	// transaction ends before its database is closed.
	t.Cleanup(func() { _ = drv.Rollback(context.Background(), tx) })

	tr := &tracker{Executor: drv.UnwrapExecutor(tx)}
	sc.run(t, tr)
	if t.Failed() {
		return
	}
	inside := tr.snapshot(t)

	if m == modeTxRollback {
		if err := drv.Rollback(ctx, tx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		for k := range inside {
			rec, err := drv.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: k.scope, Key: k.key})
			if !errors.Is(err, driver.ErrNotFound) {
				t.Errorf("after rollback, RecordGet(%q, %q) = %+v, %v; want ErrNotFound", k.scope, k.key, rec, err)
			}
		}
		return
	}

	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	for k, want := range inside {
		got, err := drv.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: k.scope, Key: k.key})
		if want == nil {
			if !errors.Is(err, driver.ErrNotFound) {
				t.Errorf("after commit, RecordGet(%q, %q) = %+v, %v; want ErrNotFound as inside the transaction", k.scope, k.key, got, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("after commit, RecordGet(%q, %q): %v", k.scope, k.key, err)
			continue
		}
		if d := diffRecord(got, want); d != "" {
			t.Errorf("after commit, record (%q, %q) differs from what the transaction saw:\n%s", k.scope, k.key, d)
		}
	}
}

type scopedKey struct{ scope, key string }

// tracker is an Executor that remembers every (scope, key) it was asked
// about, so that runScenario can compare them after the transaction ends.
type tracker struct {
	driver.Executor

	mu   sync.Mutex
	keys map[scopedKey]struct{}
}

func (tr *tracker) touch(scope, key string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.keys == nil {
		tr.keys = map[scopedKey]struct{}{}
	}
	tr.keys[scopedKey{scope, key}] = struct{}{}
}

// snapshot reads every touched record through the transaction; nil marks a
// record the transaction does not see.
func (tr *tracker) snapshot(t *testing.T) map[scopedKey]*driver.Record {
	t.Helper()
	out := map[scopedKey]*driver.Record{}
	for k := range tr.keys {
		rec, err := tr.Executor.RecordGet(t.Context(), &driver.RecordGetParams{Scope: k.scope, Key: k.key})
		switch {
		case errors.Is(err, driver.ErrNotFound):
			out[k] = nil
		case err != nil:
			t.Fatalf("RecordGet(%q, %q) in the transaction: %v", k.scope, k.key, err)
		default:
			out[k] = rec
		}
	}
	return out
}

func (tr *tracker) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	tr.touch(p.Scope, p.Key)
	return tr.Executor.RecordClaim(ctx, p)
}

func (tr *tracker) RecordGet(ctx context.Context, p *driver.RecordGetParams) (*driver.Record, error) {
	tr.touch(p.Scope, p.Key)
	return tr.Executor.RecordGet(ctx, p)
}

func (tr *tracker) RecordComplete(ctx context.Context, p *driver.RecordCompleteParams) error {
	tr.touch(p.Scope, p.Key)
	return tr.Executor.RecordComplete(ctx, p)
}

func (tr *tracker) RecordRelease(ctx context.Context, p *driver.RecordReleaseParams) error {
	tr.touch(p.Scope, p.Key)
	return tr.Executor.RecordRelease(ctx, p)
}

func (tr *tracker) RecordExtendLease(ctx context.Context, p *driver.RecordExtendLeaseParams) error {
	tr.touch(p.Scope, p.Key)
	return tr.Executor.RecordExtendLease(ctx, p)
}
