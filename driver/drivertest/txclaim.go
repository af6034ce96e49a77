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
	claim := func(key string, wait time.Duration) (TTx, *driver.TxClaimResult) {
		t.Helper()
		tx, res, err := tc.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Wait: wait})
		if err != nil {
			t.Fatalf("BeginClaim(%s): %v", key, err)
		}
		return tx, res
	}

	// A new key: locked, no record; the completed record is stored once.
	tx, res := claim("k1", 0)
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
	tx, res = claim("k1", 0)
	if !res.Locked || res.Record == nil || res.Record.State != driver.StateCompleted {
		t.Fatalf("BeginClaim(stored key) = %+v; want locked with the completed record", res)
	}
	rollback(t, drv, tx)

	// Inserting a key that exists (stored by a writer that took no lock)
	// fails with ErrLeaseLost and commits nothing.
	tx, _ = claim("k1", 0)
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
	tx, _ = claim("k1", 0)
	if err := tc.CommitComplete(ctx, tx, complete("k1", later, true)); err != nil {
		t.Fatalf("CommitComplete(replace expired): %v", err)
	}
	tx, _ = claim("k1", 0)
	if err := tc.CommitComplete(ctx, tx, complete("k1", later, true)); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("CommitComplete(replace live): %v, want ErrLeaseLost", err)
	}

	if !drv.Caps().ConcurrentWriters {
		return // SQLite: the write transaction is the lock
	}
	// A held lock: a second claim without Wait is refused at once; with
	// Wait it gets the lock when the first commits and reads its record.
	tx, _ = claim("k2", 0)
	if _, res2 := claim("k2", 0); res2.Locked {
		t.Fatal("a second BeginClaim got a held lock")
	}
	start := time.Now()
	if _, res2 := claim("k2", 100*time.Millisecond); res2.Locked || time.Since(start) > 2*time.Second {
		t.Fatalf("BeginClaim(Wait 100ms) on a held lock: %+v after %s; want not locked, promptly", res2, time.Since(start))
	}
	got := make(chan *driver.TxClaimResult, 1)
	go func() {
		tx2, res2, err := tc.BeginClaim(context.Background(), &driver.TxClaimParams{Scope: "s", Key: "k2", Wait: 10 * time.Second})
		if err != nil {
			t.Errorf("BeginClaim(Wait): %v", err)
			got <- nil
			return
		}
		if res2.Locked {
			_ = drv.Rollback(context.Background(), tx2)
		}
		got <- res2
	}()
	time.Sleep(100 * time.Millisecond)
	if err := tc.CommitComplete(ctx, tx, complete("k2", t0, false)); err != nil {
		t.Fatal(err)
	}
	if res2 := <-got; res2 == nil || !res2.Locked || res2.Record == nil || res2.Record.State != driver.StateCompleted {
		t.Fatalf("the waiting BeginClaim got %+v; want the lock and the committed record", res2)
	}
}
