package cleanup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
)

// TestLeaseValidityCountsFromAcquire: when renewals fail, the sweep stops once
// the lease it acquired has expired (Started + Lease), however long the
// acquisition itself took, not one Lease after the sweep began renewing.
func TestLeaseValidityCountsFromAcquire(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	t0 := time.Date(2031, 3, 14, 3, 0, 0, 0, time.UTC)
	var calls atomic.Int64
	var cur atomic.Int64
	cur.Store(t0.Add(900 * time.Millisecond).UnixNano()) // the acquisition took 900ms
	now := func() time.Time {
		if calls.Add(1) == 1 {
			return t0 // Report.Started: the lease is acquired until t0 + Lease
		}
		return time.Unix(0, cur.Load())
	}
	broken := false
	start := time.Now()
	c, err := cleanup.New(drv, oneRule(time.Second, now, func(ctx context.Context, _ driver.Executor, _ time.Time, limit int) (int, error) {
		if !broken { // renewals fail from now on, and the lease expires
			broken = true
			if _, err := drv.DB().ExecContext(ctx, `ALTER TABLE idem_lock RENAME TO idem_lock_gone`); err != nil {
				return 0, err
			}
			cur.Store(t0.Add(time.Second + time.Millisecond).UnixNano())
		}
		if time.Since(start) > 1500*time.Millisecond {
			return 0, nil
		}
		return slowBatch(ctx, limit)
	}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(t.Context()); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("RunOnce = %v; want ErrLeaseLost: the lease acquired until %s had expired", err, t0.Add(time.Second))
	}
}

// hangingRenewals is a SQLite driver whose lease renewals hang until their
// context ends, as on a dead connection.
type hangingRenewals struct{ *sqlitedriver.Driver }

func (d hangingRenewals) Executor() driver.Executor { return hangingExecutor{d.Driver.Executor()} }

type hangingExecutor struct{ driver.Executor }

func (hangingExecutor) LockRenew(ctx context.Context, _ *driver.LockRenewParams) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestSweepStopsWhenRenewalHangs: a renewal that hangs does not keep the
// sweep going past its lease (another replica may take it over then), and
// RunOnce returns.
func TestSweepStopsWhenRenewalHangs(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	drv := hangingRenewals{testdb.SQLite(t)}
	var start time.Time // set before RunOnce, which acquires the lease
	c, err := cleanup.New(drv, oneRule(lease, nil, func(ctx context.Context, _ driver.Executor, _ time.Time, limit int) (int, error) {
		if time.Since(start) > 10*lease {
			return 0, nil // the test's own bound
		}
		return slowBatch(ctx, limit)
	}))
	if err != nil {
		t.Fatal(err)
	}
	// Seconds the process got no CPU (a loaded CI machine stalls it at
	// times) are the machine's, not the sweep's.
	watch := stallmeter.Start(t)
	start = time.Now()
	ran := make(chan error, 1)
	go func() {
		_, err := c.RunOnce(t.Context())
		ran <- err
	}()
	select {
	case err := <-ran:
		if !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("RunOnce = %v; want ErrLeaseLost", err)
		}
		if d, stalled := time.Since(start), watch.Stop(); d > lease+lease/2+stalled {
			t.Errorf("the sweep stopped %s after it began (the process stalled %s meanwhile); its lease lasted %s", d.Round(time.Millisecond), stalled, lease)
		}
	case <-time.After(20 * lease):
		t.Fatal("RunOnce did not return: the sweep waits for a renewal that hangs")
	}
}

// oneRule is a cleaner's Config with idem's tables left alone and one rule
// deleting with del, under a lease of lease, released after the sweep.
func oneRule(lease time.Duration, now func() time.Time, del func(context.Context, driver.Executor, time.Time, int) (int, error)) *cleanup.Config {
	return &cleanup.Config{
		Records: cleanup.RecordRetention{Disabled: true}, Inbox: cleanup.InboxRetention{Disabled: true},
		Outbox: cleanup.OutboxRetention{Disabled: true}, Sagas: cleanup.SagaRetention{Disabled: true},
		Lease: lease, Hold: cleanup.NoHold, Pause: cleanup.NoPause, Now: now, BatchSize: 10,
		Rules: []cleanup.Rule{{Table: "slow", Delete: del}},
	}
}

// slowBatch is a full batch of limit rows deleted in 20ms, or ctx's end.
func slowBatch(ctx context.Context, limit int) (int, error) {
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(20 * time.Millisecond):
		return limit, nil
	}
}
