package outbox_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// leaseStates records the calls of a relay's RelayConfig.OnLease.
type leaseStates struct {
	mu     sync.Mutex
	states []bool
}

func (l *leaseStates) on(held bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.states = append(l.states, held)
}

func (l *leaseStates) get() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.states)
}

func (l *leaseStates) wait(t *testing.T, what string, want ...bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(l.get(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: OnLease calls %v; want %v", what, l.get(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// On SQLite, OnLease tells which relay publishes: the one holding the
// lease gets true, the standby false; when the active relay stops it gets
// false and the standby, taking over, true. Batches call it no more.
func TestSQLiteOnLeaseReportsWhichRelayPublishes(t *testing.T) {
	t.Parallel()
	a, b := sharedSQLite(t)
	events := backlog(t, a, 3, 10)
	rc := newRecorder(time.Millisecond)
	var la, lb leaseStates
	cfg := outbox.RelayConfig{BatchSize: 5, PollInterval: 10 * time.Millisecond, Lease: time.Hour}
	cfgA, cfgB := cfg, cfg
	cfgA.OnLease, cfgB.OnLease = la.on, lb.on
	ra := runRelay(t, a, rc.publisher("a"), cfgA)
	la.wait(t, "relay a, alone", true)
	waitFor(t, 10*time.Second, "relay a publishes the backlog", func() bool { return rc.published() == len(events) })
	rb := runRelay(t, b, rc.publisher("b"), cfgB)
	lb.wait(t, "relay b, while a publishes", false)
	more := backlog(t, a, 3, 2)
	waitFor(t, 10*time.Second, "relay a publishes new events", func() bool { return rc.published() == len(events)+len(more) })
	time.Sleep(50 * time.Millisecond) // b tries the lease a few more times
	if got := la.get(); !slices.Equal(got, []bool{true}) {
		t.Errorf("relay a, after %d batches: OnLease calls %v; want [true] (changes only)", rc.publishedBy("a")/5, got)
	}
	if got := lb.get(); !slices.Equal(got, []bool{false}) {
		t.Errorf("relay b, standing by: OnLease calls %v; want [false] (changes only)", got)
	}

	ra.stop()
	la.wait(t, "relay a, stopped", true, false)
	lb.wait(t, "relay b, after a stopped", false, true)
	last := backlog(t, a, 1, 1)
	waitFor(t, 10*time.Second, "relay b publishes", func() bool { return rc.publishedBy("b") == len(last) })
	rb.stop()
	lb.wait(t, "relay b, stopped", false, true, false)
}

// On PostgreSQL relays share the lanes and never stand by: each one's
// OnLease gets true when Run starts, false when it returns, and nothing in
// between.
func TestPostgresOnLeaseIsTrueWhileRunning(t *testing.T) {
	t.Parallel()
	drv, _ := testdb.PostgresSQLSchema(t)
	rc := newRecorder(time.Millisecond)
	var la, lb leaseStates
	// Both relays listen, on one pgsqldriver.Driver (two listeners copied
	// from one pool connection raced before pgsqldriver cleared the copied
	// OnNotification).
	cfg := outbox.RelayConfig{BatchSize: 5, PollInterval: 10 * time.Millisecond}
	cfgA, cfgB := cfg, cfg
	cfgA.OnLease, cfgB.OnLease = la.on, lb.on
	ra := runRelay(t, drv, rc.publisher("a"), cfgA)
	rb := runRelay(t, drv, rc.publisher("b"), cfgB)
	la.wait(t, "relay a", true)
	lb.wait(t, "relay b", true)
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for k := range 4 {
		for range 5 {
			if err := outbox.EnqueueTx(ctx, drv, tx, mustEvent(t, string(rune('a'+k)))); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the relays publish", func() bool { return rc.published() == n })
	if got := la.get(); !slices.Equal(got, []bool{true}) {
		t.Errorf("relay a, while running: OnLease calls %v; want [true]", got)
	}
	ra.stop()
	la.wait(t, "relay a, stopped", true, false)
	if got := lb.get(); !slices.Equal(got, []bool{true}) {
		t.Errorf("relay b, still running: OnLease calls %v; want [true]", got)
	}
	rb.stop()
	lb.wait(t, "relay b, stopped", true, false)
}

// A relay cut off from the lock table stops publishing before its lease
// expires: OnLease says so (false), and true again when it holds the
// lease once more.
func TestSQLiteOnLeaseReportsALostLease(t *testing.T) {
	t.Parallel()
	a, _ := sharedSQLite(t)
	var fail atomic.Bool
	var l leaseStates
	cfg := outbox.RelayConfig{PollInterval: 10 * time.Millisecond, Lease: 300 * time.Millisecond, OnLease: l.on}
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	runRelay(t, cutOffDriver{Driver: a, locks: failingLocks{LockExecutor: a.Locks(), fail: &fail}}, pub, cfg)
	l.wait(t, "relay, alone", true)
	fail.Store(true)
	l.wait(t, "relay, its renewals failing", true, false)
	fail.Store(false)
	l.wait(t, "relay, the lock table back", true, false, true)
}
