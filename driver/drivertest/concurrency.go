package drivertest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

const (
	// duplicates is how many identical requests arrive at once.
	duplicates = 50
	// blockWait is how long a claim that must wait for a concurrent
	// transaction is watched to make sure it does wait. It bounds the
	// check, it does not order anything.
	blockWait = 200 * time.Millisecond
	// settleWait bounds how long a waiting claim may take to finish once
	// the transaction it waits for has ended.
	settleWait = 10 * time.Second
)

type claimOutcome struct {
	token string
	res   *driver.RecordClaimResult
	err   error
}

// claimAll makes n claims of the same key at once through the drivers'
// executors, in turn; params(i) builds the i-th claim.
func claimAll[TTx any](t *testing.T, drvs []driver.Driver[TTx], n int, params func(i int) *driver.RecordClaimParams) []claimOutcome {
	t.Helper()
	out := make([]claimOutcome, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		p := params(i)
		wg.Go(func() {
			<-start
			res, err := drvs[i%len(drvs)].Executor().RecordClaim(t.Context(), p)
			out[i] = claimOutcome{token: p.LeaseToken, res: res, err: err}
		})
	}
	close(start)
	wg.Wait()
	return out
}

// oneWinner checks that exactly one claim succeeded, that every other one
// saw the winner's claim, and returns the winner's token.
func oneWinner(t *testing.T, out []claimOutcome) string {
	t.Helper()
	var winners []string
	for _, o := range out {
		if o.err != nil {
			t.Fatalf("claim %s: %v", o.token, o.err)
		}
		if o.res.Claimed {
			winners = append(winners, o.token)
		}
	}
	if len(winners) != 1 {
		t.Fatalf("%d concurrent duplicate claims: %d claimed the key (first ones: %v); want exactly 1", len(out), len(winners), winners[:min(len(winners), 3)])
	}
	for _, o := range out {
		if o.res.Claimed {
			continue
		}
		if o.res.Existing == nil || o.res.Existing.LeaseToken != winners[0] || o.res.Existing.State != driver.StateInProgress {
			t.Errorf("claim %s lost but got Existing=%s; want the winner's in-progress record (lease %s)", o.token, fmtRecord(o.res.Existing), winners[0])
		}
	}
	return winners[0]
}

// Duplicates arriving together: exactly one executes.
func testConcurrentClaims[TTx any](t *testing.T, drvs []driver.Driver[TTx]) {
	drv := drvs[0]
	now := t0
	out := claimAll(t, drvs, duplicates, func(i int) *driver.RecordClaimParams {
		fp := fpA
		if i%2 == 1 { // a client reusing the key for another request races too
			fp = fpB
		}
		return claimAt("key-1", fp, newToken(), now)
	})
	winner := oneWinner(t, out)
	rec, err := drv.Executor().RecordGet(t.Context(), &driver.RecordGetParams{Scope: testScope, Key: "key-1"})
	if err != nil {
		t.Fatalf("RecordGet: %v", err)
	}
	if rec.LeaseToken != winner {
		t.Errorf("stored lease %q; want the winner's %q", rec.LeaseToken, winner)
	}
}

// Retries of a crashed request arriving together: exactly one takes over.
func testConcurrentTakeover[TTx any](t *testing.T, drvs []driver.Driver[TTx]) {
	drv := drvs[0]
	crashed := claimAt("key-1", fpA, newToken(), t0)
	mustClaim(t, drv.Executor(), crashed)
	later := crashed.LeaseExpiresAt.Add(time.Second)
	out := claimAll(t, drvs, duplicates, func(int) *driver.RecordClaimParams {
		return claimAt("key-1", fpA, newToken(), later)
	})
	winner := oneWinner(t, out)
	rec, err := drv.Executor().RecordGet(t.Context(), &driver.RecordGetParams{Scope: testScope, Key: "key-1"})
	if err != nil {
		t.Fatalf("RecordGet: %v", err)
	}
	if rec.LeaseToken != winner {
		t.Errorf("stored lease %q; want the winner's %q", rec.LeaseToken, winner)
	}
}

func requireConcurrentWriters[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	t.Helper()
	if !drv.Caps().ConcurrentWriters {
		t.Skipf("%s serialises writers: a second transaction cannot start while one is open", drv.Name())
	}
}

// claimInBackground runs the claim p through ex in a goroutine.
func claimInBackground(ctx context.Context, ex driver.Executor, p *driver.RecordClaimParams) <-chan claimOutcome {
	done := make(chan claimOutcome, 1)
	go func() {
		res, err := ex.RecordClaim(ctx, p)
		done <- claimOutcome{token: p.LeaseToken, res: res, err: err}
	}()
	return done
}

// mustBlock checks that the claim does not finish while the transaction it
// conflicts with is open.
func mustBlock(t *testing.T, done <-chan claimOutcome) {
	t.Helper()
	select {
	case o := <-done:
		t.Fatalf("second claim returned while the first transaction was still open: Claimed=%v Existing=%s err=%v",
			o.res != nil && o.res.Claimed, fmtRecord(existing(o.res)), o.err)
	case <-time.After(blockWait):
	}
}

func mustFinish(t *testing.T, done <-chan claimOutcome) claimOutcome {
	t.Helper()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("second claim: %v", o.err)
		}
		return o
	case <-time.After(settleWait):
		t.Fatalf("second claim still blocked %s after the first transaction ended", settleWait)
	}
	return claimOutcome{}
}

func existing(res *driver.RecordClaimResult) *driver.Record {
	if res == nil {
		return nil
	}
	return res.Existing
}

// Two transactions claim one key: the second waits for the first and, once
// it commits, gets its stored response instead of executing again.
func testTxWaitsForCommit[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	now := t0
	tx1 := begin(t, drv)
	tx2 := begin(t, drv)
	p := claimAt("key-1", fpA, newToken(), now)
	mustClaim(t, drv.UnwrapExecutor(tx1), p)

	done := claimInBackground(t.Context(), drv.UnwrapExecutor(tx2), claimAt("key-1", fpA, newToken(), now))
	mustBlock(t, done)

	c := completeParams(p, 201, []byte(`{"Location":["/payments/1"]}`), []byte(`{"id":1}`))
	complete(t, drv.UnwrapExecutor(tx1), c)
	commit(t, drv, tx1)

	o := mustFinish(t, done)
	if o.res.Claimed {
		t.Fatal("second transaction claimed a key the first one had committed")
	}
	if d := diffRecord(o.res.Existing, completed(p, c)); d != "" {
		t.Errorf("second transaction's Existing differs from the committed record:\n%s", d)
	}
}

// If the first transaction rolls back, the waiting one claims the key.
func testTxClaimsAfterRollback[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	now := t0
	tx1 := begin(t, drv)
	tx2 := begin(t, drv)
	mustClaim(t, drv.UnwrapExecutor(tx1), claimAt("key-1", fpA, newToken(), now))

	q := claimAt("key-1", fpA, newToken(), now)
	done := claimInBackground(t.Context(), drv.UnwrapExecutor(tx2), q)
	mustBlock(t, done)
	rollback(t, drv, tx1)

	o := mustFinish(t, done)
	if !o.res.Claimed {
		t.Fatalf("after the first transaction rolled back, the second got Existing=%s; want Claimed", fmtRecord(o.res.Existing))
	}
	commit(t, drv, tx2)
	mustGet(t, drv.Executor(), testScope, "key-1", inProgress(q))
}

// A claim outside any transaction waits for a concurrent uncommitted claim
// too, and then sees it.
func testExecutorWaitsForCommit[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	now := t0
	tx1 := begin(t, drv)
	p := claimAt("key-1", fpA, newToken(), now)
	mustClaim(t, drv.UnwrapExecutor(tx1), p)

	done := claimInBackground(t.Context(), drv.Executor(), claimAt("key-1", fpB, newToken(), now))
	mustBlock(t, done)
	commit(t, drv, tx1)

	o := mustFinish(t, done)
	if o.res.Claimed {
		t.Fatal("claim outside a transaction took a key claimed by a committed transaction")
	}
	if d := diffRecord(o.res.Existing, inProgress(p)); d != "" {
		t.Errorf("Existing differs from the committed claim:\n%s", d)
	}
}

// LockTimeout bounds the wait for a concurrent uncommitted claim, in a
// transaction and outside one.
func testLockTimeout[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	now := t0
	tx1 := begin(t, drv)
	p := claimAt("key-1", fpA, newToken(), now)
	mustClaim(t, drv.UnwrapExecutor(tx1), p)

	const timeout = 100 * time.Millisecond
	for _, via := range []string{"Executor", "Tx"} {
		ex := drv.Executor()
		if via == "Tx" {
			ex = drv.UnwrapExecutor(begin(t, drv))
		}
		q := claimAt("key-1", fpA, newToken(), now)
		q.LockTimeout = timeout
		// The context only keeps a broken LockTimeout from hanging the test.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		start := time.Now()
		res, err := ex.RecordClaim(ctx, q)
		elapsed := time.Since(start)
		cancel()
		if !errors.Is(err, driver.ErrLockTimeout) {
			t.Fatalf("%s: claim with LockTimeout %s while another transaction holds the key = Claimed=%v Existing=%s err=%v after %s; want driver.ErrLockTimeout",
				via, timeout, res != nil && res.Claimed, fmtRecord(existing(res)), err, elapsed)
		}
		if elapsed < timeout-10*time.Millisecond || elapsed > timeout+5*time.Second {
			t.Errorf("%s: ErrLockTimeout after %s; want about %s", via, elapsed, timeout)
		}
	}

	// Without contention the same claim does not wait.
	commit(t, drv, tx1)
	q := claimAt("key-1", fpA, newToken(), now)
	q.LockTimeout = timeout
	mustFindExisting(t, drv.Executor(), q, inProgress(p))
}
