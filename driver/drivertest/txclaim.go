package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

// testTxClaim checks driver.TxClaimer, for backends that implement it: the
// lock, the read, the single completed write and its conflicts.
func testTxClaim[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	tc, ok := drv.(driver.TxClaimer[TTx])
	if !ok {
		t.Skipf("%s does not implement driver.TxClaimer (optional)", drv.Name())
	}
	ctx := t.Context()
	complete := func(key string, at time.Time, replace bool) *driver.TxCompleteParams {
		return &driver.TxCompleteParams{Scope: "s", Key: key, Fingerprint: []byte("fp"), Status: 201,
			Headers: []byte(`{"Content-Type":["application/json"]}`), Body: []byte(`{"ok":true}`),
			CreatedAt: at, ExpiresAt: at.Add(24 * time.Hour), Replace: replace}
	}
	// The wait of a claim that nothing contends: on SQLite a zero Wait
	// still allows 25 ms for the connection, which a loaded machine (a
	// -race run on 2 busy cores) overran, the claim then not locked.
	const free = 10 * time.Second
	claim := func(key string, wait time.Duration) (TTx, *driver.TxClaimResult) {
		t.Helper()
		tx, res, err := tc.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Wait: wait})
		if err != nil {
			t.Fatalf("BeginClaim(%s): %v", key, err)
		}
		return tx, res
	}

	// A new key: locked, no record; the completed record is stored once.
	tx, res := claim("k1", free)
	if !res.Locked || res.Record != nil {
		t.Fatalf("BeginClaim(new key) = %+v; want locked, no record", res)
	}
	if err := tc.CommitComplete(ctx, tx, complete("k1", t0, false)); err != nil {
		t.Fatalf("CommitComplete: %v", err)
	}
	rec, err := drv.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k1"})
	if err != nil || rec.State != driver.StateCompleted || rec.Status != 201 || string(rec.Body) != `{"ok":true}` ||
		!rec.ExpiresAt.Equal(t0.Add(24*time.Hour)) || rec.LeaseToken != "" {
		t.Fatalf("stored record %+v, %v", rec, err)
	}
	tx, res = claim("k1", free)
	if !res.Locked || res.Record == nil || res.Record.State != driver.StateCompleted {
		t.Fatalf("BeginClaim(stored key) = %+v; want locked with the completed record", res)
	}
	rollback(t, drv, tx)

	// Inserting a key that exists (stored by a writer that took no lock)
	// fails with ErrLeaseLost and commits nothing.
	tx, _ = claim("k1", free)
	if _, err := drv.UnwrapExecutor(tx).OutboxInsert(ctx, []driver.OutboxRow{obRow(t, "effect", 1, t0)}); err != nil {
		t.Fatal(err)
	}
	if err := tc.CommitComplete(ctx, tx, complete("k1", t0, false)); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("CommitComplete of a stored key: %v, want ErrLeaseLost", err)
	}
	if _, ok, _ := drv.Executor().OutboxOldestUnpublished(ctx); ok {
		t.Fatal("the transaction's write was committed with a conflicting record")
	}

	// Replace: an expired record is replaced; a live one is not.
	later := t0.Add(25 * time.Hour)
	tx, _ = claim("k1", free)
	if err := tc.CommitComplete(ctx, tx, complete("k1", later, true)); err != nil {
		t.Fatalf("CommitComplete(replace expired): %v", err)
	}
	tx, _ = claim("k1", free)
	if err := tc.CommitComplete(ctx, tx, complete("k1", later, true)); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("CommitComplete(replace live): %v, want ErrLeaseLost", err)
	}

	if !drv.Caps().ConcurrentWriters {
		return // SQLite: the write transaction is the lock
	}
	// A held lock: a second claim without Wait is refused at once; with
	// Wait it gets the lock when the first commits and reads its record.
	tx, _ = claim("k2", free)
	if _, res2 := claim("k2", 0); res2.Locked {
		t.Fatal("a second BeginClaim got a held lock")
	}
	start := time.Now()
	if _, res2 := claim("k2", 100*time.Millisecond); res2.Locked || time.Since(start) > 2*time.Second {
		t.Fatalf("BeginClaim(Wait 100ms) on a held lock: %+v after %s; want not locked, promptly", res2, time.Since(start))
	}
	got := waitingClaim(t, drv, tc, "k2")
	time.Sleep(100 * time.Millisecond)
	if err := tc.CommitComplete(ctx, tx, complete("k2", t0, false)); err != nil {
		t.Fatal(err)
	}
	if res2 := <-got; res2 == nil || !res2.Locked || res2.Record == nil || res2.Record.State != driver.StateCompleted {
		t.Fatalf("the waiting BeginClaim got %+v; want the lock and the committed record", res2)
	}
}

// testTxClaimNow checks BeginClaim with p.Now: a completed live record may
// be answered without the lock (then there is no transaction and no lock is
// held), and whatever path the backend takes, the lock of a claim is
// released with its commit or rollback, and the transaction's first
// statement runs inside it.
func testTxClaimNow[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	tc, ok := drv.(driver.TxClaimer[TTx])
	if !ok {
		t.Skipf("%s does not implement driver.TxClaimer (optional)", drv.Name())
	}
	ctx := t.Context()
	// As in testTxClaim: the claims nothing contends wait (on SQLite a
	// zero Wait allows 25 ms for the connection, which a loaded machine
	// overran); the one made while another transaction holds the lock
	// keeps a zero Wait.
	const free = 10 * time.Second
	claimWait := func(key string, now time.Time, wait time.Duration) (TTx, *driver.TxClaimResult) {
		t.Helper()
		tx, res, err := tc.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Now: now, Wait: wait})
		if err != nil {
			t.Fatalf("BeginClaim(%s): %v", key, err)
		}
		return tx, res
	}
	claim := func(key string, now time.Time) (TTx, *driver.TxClaimResult) {
		t.Helper()
		return claimWait(key, now, free)
	}
	complete := func(key string, at time.Time) *driver.TxCompleteParams {
		return &driver.TxCompleteParams{Scope: "s", Key: key, Fingerprint: []byte("fp"), Status: 201,
			Body: []byte(`{"ok":true}`), CreatedAt: at, ExpiresAt: at.Add(time.Hour)}
	}

	// A claim with nothing written by the command: committed, then the key
	// is free again (no lock left behind on the connection).
	tx, res := claim("n1", t0)
	if !res.Locked || res.Record != nil {
		t.Fatalf("BeginClaim(new key, Now) = %+v; want locked, no record", res)
	}
	if err := tc.CommitComplete(ctx, tx, complete("n1", t0)); err != nil {
		t.Fatalf("CommitComplete without a statement: %v", err)
	}
	// Live at t0: replayed, with or without the lock.
	tx, res = claim("n1", t0.Add(time.Minute))
	if res.Record == nil || res.Record.State != driver.StateCompleted || string(res.Record.Body) != `{"ok":true}` {
		t.Fatalf("BeginClaim(completed key, Now) = %+v; want its completed record", res)
	}
	if res.Locked {
		rollback(t, drv, tx)
	}
	// The lock is free: a claim that takes it (Now zero: always the lock)
	// gets it at once.
	tx, res = claim("n1", time.Time{})
	if !res.Locked {
		t.Fatal("the key's lock is still held after its claim committed")
	}
	if drv.Caps().ConcurrentWriters {
		// While another transaction holds the lock (a concurrent retry of
		// the completed request, on any replica), a claim with Now still
		// answers the completed record: a caller that does not wait
		// (idemhttp.NoWait) would otherwise answer 409 in progress for a
		// request completed long ago, and one that waits would queue
		// behind every replay.
		tx2, res2 := claimWait("n1", t0.Add(time.Minute), 0)
		if res2.Locked {
			rollback(t, drv, tx2)
		}
		if res2.Locked || res2.Record == nil || res2.Record.State != driver.StateCompleted {
			rollback(t, drv, tx) // the key's lock, or the test's cleanup waits for its connection
			t.Fatalf("BeginClaim(completed key, Now) while its lock is held = %+v; want the completed record, not locked", res2)
		}
	}
	rollback(t, drv, tx)

	// The first statement of the claim's transaction runs inside it: rolled
	// back, nothing stays, and the lock is free again.
	tx, res = claim("n2", t0)
	if !res.Locked {
		t.Fatalf("BeginClaim(n2) = %+v; want locked", res)
	}
	if _, err := drv.UnwrapExecutor(tx).OutboxInsert(ctx, []driver.OutboxRow{obRow(t, "n2-effect", 1, t0)}); err != nil {
		t.Fatal(err)
	}
	rollback(t, drv, tx)
	if _, ok, _ := drv.Executor().OutboxOldestUnpublished(ctx); ok {
		t.Fatal("the first statement of a rolled back claim was committed")
	}
	tx, res = claim("n2", time.Time{})
	if !res.Locked {
		t.Fatal("the key's lock is still held after its claim rolled back")
	}
	// Committed with the record: both the effect and the record stay.
	if _, err := drv.UnwrapExecutor(tx).OutboxInsert(ctx, []driver.OutboxRow{obRow(t, "n2-effect", 2, t0)}); err != nil {
		t.Fatal(err)
	}
	if err := tc.CommitComplete(ctx, tx, complete("n2", t0)); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := drv.Executor().OutboxOldestUnpublished(ctx); !ok {
		t.Fatal("the effect of a committed claim is missing")
	}
	// A duplicate waiting for the lock while the holder commits without
	// having written anything gets the lock only once the record is
	// committed: it sees the record.
	if drv.Caps().ConcurrentWriters {
		tx, res = claim("n3", t0)
		if !res.Locked {
			t.Fatalf("BeginClaim(n3) = %+v; want locked", res)
		}
		got := waitingClaim(t, drv, tc, "n3")
		time.Sleep(50 * time.Millisecond)
		if err := tc.CommitComplete(ctx, tx, complete("n3", t0)); err != nil {
			t.Fatal(err)
		}
		if res2 := <-got; res2 == nil || res2.Record == nil || res2.Record.State != driver.StateCompleted {
			t.Fatalf("the waiting BeginClaim got %+v; want the committed record", res2)
		}
	}

	// Expired at Now: not replayed; the claim takes the lock to replace it.
	tx, res = claim("n2", t0.Add(2*time.Hour))
	if !res.Locked || res.Record == nil {
		t.Fatalf("BeginClaim(expired key) = %+v; want locked with the old record", res)
	}
	rollback(t, drv, tx)
}

// waitingClaim starts a BeginClaim of key in scope "s" that waits up to 10 s
// for the lock, and returns the channel its result arrives on (nil after an
// error, which is reported). A claim that got the lock is rolled back.
func waitingClaim[TTx any](t *testing.T, drv driver.Driver[TTx], tc driver.TxClaimer[TTx], key string) <-chan *driver.TxClaimResult {
	t.Helper()
	got := make(chan *driver.TxClaimResult, 1)
	go func() {
		tx, res, err := tc.BeginClaim(context.Background(), &driver.TxClaimParams{Scope: "s", Key: key, Wait: 10 * time.Second})
		if err != nil {
			t.Errorf("BeginClaim(Wait): %v", err)
			got <- nil
			return
		}
		if res.Locked {
			_ = drv.Rollback(context.Background(), tx)
		}
		got <- res
	}()
	return got
}
