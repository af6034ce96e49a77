package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// frozenLocks is the lock table as seen by a frozen process: its renewals
// wait until it thaws.
type frozenLocks struct {
	driver.LockExecutor
	frozen *atomic.Bool
	thaw   <-chan struct{}
}

func (l frozenLocks) LockRenew(ctx context.Context, p *driver.LockRenewParams) error {
	if l.frozen.Load() {
		<-l.thaw
	}
	return l.LockExecutor.LockRenew(ctx, p)
}

// A SQLite relay frozen while the broker acknowledges its batch (a long GC
// pause, a VM migration, SIGSTOP: its lease renewals freeze with it), for
// longer than its lease: the standby takes over and publishes every event
// (those of the frozen batch again, as after a crash). When the frozen one
// wakes up it marks nothing (its marks' deadline is its lease's expiry),
// leaves no row unpublished, publishes nothing more while the other holds
// the lease, and each key's events reach the broker first in their order.
func TestSQLiteRelayFrozenPastItsLease(t *testing.T) {
	t.Parallel()
	a, b := sharedSQLite(t)
	events := backlog(t, a, 3, 4)
	rc := newRecorder(time.Millisecond)
	var frozen atomic.Bool
	thaw := make(chan struct{})
	froze := make(chan struct{})
	recA := rc.publisher("a")
	var afterThaw atomic.Int32
	pubA := outbox.PublisherFunc(func(ctx context.Context, es []event.Envelope) error {
		if frozen.Load() {
			afterThaw.Add(int32(len(es)))
		}
		if err := recA.Publish(ctx, es); err != nil {
			return err
		}
		if frozen.CompareAndSwap(false, true) {
			close(froze)
			<-thaw // acknowledged, then frozen before Publish returns
		}
		return nil
	})
	const lease = time.Second
	cfg := outbox.RelayConfig{BatchSize: 5, PollInterval: 10 * time.Millisecond, Lease: lease, PublishTimeout: time.Minute}
	runRelay(t, cutOffDriver{Driver: a, locks: failingLocks{LockExecutor: frozenLocks{LockExecutor: a.Locks(), frozen: &frozen, thaw: thaw}, fail: new(atomic.Bool)}}, pubA, cfg)
	select {
	case <-froze:
	case <-time.After(10 * time.Second):
		t.Fatal("relay a never published")
	}
	// The standby's own lease is longer: with the machine busy, the test
	// process stalled past a 1 s lease of the standby too, which then
	// rightly published a batch of its own again (7 duplicates, not 5).
	// It still tries to take a's lease every PollInterval.
	cfgB := cfg
	cfgB.Lease = 10 * time.Second
	runRelay(t, b, rc.publisher("b"), cfgB)
	waitFor(t, 30*time.Second, "the standby takes over and publishes everything", func() bool { return rc.published() == len(events) })
	close(thaw)
	more := backlog(t, b, 3, 2)
	waitFor(t, 30*time.Second, "the events enqueued after the thaw are published", func() bool { return rc.published() == len(events)+len(more) })
	waitFor(t, 30*time.Second, "no row left unpublished", func() bool {
		_, ok, err := b.Outbox().OutboxOldestUnpublished(t.Context())
		return err == nil && !ok
	})
	if n := afterThaw.Load(); n > 0 {
		t.Errorf("the thawed relay published %d more events while the other held the lease", n)
	}
	rc.mu.Lock()
	dups := rc.dups
	rc.dups = 0 // the frozen batch published again: expected, checked below
	rc.mu.Unlock()
	if dups > 5 {
		t.Errorf("%d events published twice; want at most the frozen batch (5)", dups)
	}
	rc.check(t, append(events, more...))
	t.Logf("%d events published twice (the frozen batch), %d by the standby", dups, rc.publishedBy("b"))
}
