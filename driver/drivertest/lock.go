package drivertest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

// runLock runs the lease (idem_lock) tests against the backend that
// newDriver builds: a free lease is taken, a live one is refused to other
// owners and extended for its own, an expired one is taken over (after which
// the old owner's renew and release report ErrLeaseLost), renew and release
// work for the owner only, names are independent, a rolled-back acquire
// leaves nothing, and of many concurrent acquirers exactly one wins, both for
// a free lease and for the takeover of an expired one.
//
// newDriver has the contract of Run's: a fresh, migrated database per call.
func runLock[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx], reopen reopener[TTx]) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, drv driver.Driver[TTx])
	}{
		{"AcquireRenewRelease", testLockLifecycle[TTx]},
		{"LiveLeaseRefused", testLockLiveRefused[TTx]},
		{"ExpiredLeaseTakenOver", testLockTakeover[TTx]},
		{"NamesIndependent", testLockNames[TTx]},
		{"RollbackLeavesNothing", testLockRollback[TTx]},
	}
	concurrent := withPeers(testLockConcurrent[TTx], reopen)
	t.Run("Lock", func(t *testing.T) {
		t.Parallel()
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				tt.fn(t, newDriver(t))
			})
		}
		t.Run("ConcurrentAcquireOneWinner", func(t *testing.T) {
			t.Parallel()
			concurrent(t, newDriver)
		})
	})
}

const lockName = "idem-test-lock"

func acquire(t *testing.T, ex driver.Executor, owner string, now, until time.Time) bool {
	t.Helper()
	ok, err := ex.LockAcquire(t.Context(), &driver.LockAcquireParams{Name: lockName, Owner: owner, Now: now, Until: until})
	if err != nil {
		t.Fatalf("LockAcquire(%s, now %s, until %s): %v", owner, now, until, err)
	}
	return ok
}

func mustHold(t *testing.T, ex driver.Executor, owner string, until time.Time) {
	t.Helper()
	got, exp, err := ex.LockGet(t.Context(), &driver.LockGetParams{Name: lockName})
	if err != nil {
		t.Fatalf("LockGet: %v", err)
	}
	if got != owner || !exp.Equal(until) {
		t.Fatalf("LockGet = %s until %s; want %s until %s", got, exp, owner, until)
	}
}

func testLockLifecycle[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ex, ctx := drv.Executor(), t.Context()
	if _, _, err := ex.LockGet(ctx, &driver.LockGetParams{Name: lockName}); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("LockGet before any acquire: err = %v; want ErrNotFound", err)
	}
	if !acquire(t, ex, "a", t0, t0.Add(time.Minute)) {
		t.Fatal("LockAcquire of a free lease = false")
	}
	mustHold(t, ex, "a", t0.Add(time.Minute))
	// The owner may acquire again: it extends (or shortens) its lease.
	if !acquire(t, ex, "a", t0.Add(time.Second), t0.Add(2*time.Minute)) {
		t.Fatal("LockAcquire by the owner of a live lease = false; want true (extend)")
	}
	mustHold(t, ex, "a", t0.Add(2*time.Minute))
	if err := ex.LockRenew(ctx, &driver.LockRenewParams{Name: lockName, Owner: "a", Until: t0.Add(3 * time.Minute)}); err != nil {
		t.Fatalf("LockRenew by the owner: %v", err)
	}
	mustHold(t, ex, "a", t0.Add(3*time.Minute))
	wantLeaseLost(t, "LockRenew by a non-owner", ex.LockRenew(ctx, &driver.LockRenewParams{Name: lockName, Owner: "b", Until: t0.Add(time.Hour)}))
	wantLeaseLost(t, "LockRelease by a non-owner", ex.LockRelease(ctx, &driver.LockReleaseParams{Name: lockName, Owner: "b"}))
	mustHold(t, ex, "a", t0.Add(3*time.Minute))
	if err := ex.LockRelease(ctx, &driver.LockReleaseParams{Name: lockName, Owner: "a"}); err != nil {
		t.Fatalf("LockRelease by the owner: %v", err)
	}
	if _, _, err := ex.LockGet(ctx, &driver.LockGetParams{Name: lockName}); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("LockGet after release: err = %v; want ErrNotFound", err)
	}
	wantLeaseLost(t, "LockRelease twice", ex.LockRelease(ctx, &driver.LockReleaseParams{Name: lockName, Owner: "a"}))
	wantLeaseLost(t, "LockRenew after release", ex.LockRenew(ctx, &driver.LockRenewParams{Name: lockName, Owner: "a", Until: t0.Add(time.Hour)}))
	// Released: another owner takes it at once, before the old expiry.
	if !acquire(t, ex, "b", t0.Add(2*time.Second), t0.Add(time.Minute)) {
		t.Fatal("LockAcquire after release = false")
	}
	mustHold(t, ex, "b", t0.Add(time.Minute))
}

func testLockLiveRefused[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ex := drv.Executor()
	until := t0.Add(time.Minute)
	acquire(t, ex, "a", t0, until)
	for _, now := range []time.Time{t0, until.Add(-time.Microsecond)} {
		if acquire(t, ex, "b", now, now.Add(time.Hour)) {
			t.Fatalf("LockAcquire by b at %s of a's lease until %s = true; want false", now, until)
		}
	}
	mustHold(t, ex, "a", until)
}

func testLockTakeover[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ex, ctx := drv.Executor(), t.Context()
	until := t0.Add(time.Minute)
	acquire(t, ex, "a", t0, until)
	// expires_at not after now: expired (the boundary belongs to the taker).
	if !acquire(t, ex, "b", until, until.Add(time.Minute)) {
		t.Fatal("LockAcquire of an expired lease = false; want takeover")
	}
	mustHold(t, ex, "b", until.Add(time.Minute))
	wantLeaseLost(t, "LockRenew by the old owner", ex.LockRenew(ctx, &driver.LockRenewParams{Name: lockName, Owner: "a", Until: until.Add(time.Hour)}))
	wantLeaseLost(t, "LockRelease by the old owner", ex.LockRelease(ctx, &driver.LockReleaseParams{Name: lockName, Owner: "a"}))
	mustHold(t, ex, "b", until.Add(time.Minute))
}

func testLockNames[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ex, ctx := drv.Executor(), t.Context()
	acquire(t, ex, "a", t0, t0.Add(time.Minute))
	ok, err := ex.LockAcquire(ctx, &driver.LockAcquireParams{Name: lockName + "-other", Owner: "b", Now: t0, Until: t0.Add(time.Minute)})
	if err != nil || !ok {
		t.Fatalf("LockAcquire of another name = %v, %v; want true", ok, err)
	}
	mustHold(t, ex, "a", t0.Add(time.Minute))
}

func testLockRollback[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if !acquire(t, drv.UnwrapExecutor(tx), "a", t0, t0.Add(time.Minute)) {
		t.Fatal("LockAcquire in a transaction = false")
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	if !acquire(t, drv.Executor(), "b", t0, t0.Add(time.Minute)) {
		t.Fatal("LockAcquire after a rolled-back acquire = false")
	}
}

func testLockConcurrent[TTx any](t *testing.T, drvs []driver.Driver[TTx]) {
	drv := drvs[0]
	const n = 16
	round := func(now time.Time) string {
		var wg sync.WaitGroup
		start := make(chan struct{})
		won := make([]bool, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				<-start
				won[i], errs[i] = drvs[i%len(drvs)].Executor().LockAcquire(t.Context(), &driver.LockAcquireParams{Name: lockName, Owner: fmt.Sprintf("owner-%d", i), Now: now, Until: now.Add(time.Minute)})
			})
		}
		close(start)
		wg.Wait()
		winner := ""
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("owner-%d: LockAcquire: %v", i, errs[i])
			}
			if won[i] {
				if winner != "" {
					t.Fatalf("both %s and owner-%d acquired the lease at %s", winner, i, now)
				}
				winner = fmt.Sprintf("owner-%d", i)
			}
		}
		if winner == "" {
			t.Fatalf("no owner acquired the lease at %s", now)
		}
		mustHold(t, drv.Executor(), winner, now.Add(time.Minute))
		return winner
	}
	round(t0) // a free lease
	// Takeovers of an expired lease, several times.
	for i := 1; i <= 3; i++ {
		round(t0.Add(time.Duration(i) * time.Hour))
	}
}
