package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

var errDown = errors.New("broker down")

// enqueue commits events on a SQLite driver (see enqueueTx).
func enqueue(t *testing.T, drv *sqlitedriver.Driver, events ...event.Envelope) {
	t.Helper()
	enqueueTx[*sql.Tx](t, drv, events...)
}

// enqueueTx commits events in a transaction of drv.
func enqueueTx[TTx any](t *testing.T, drv driver.OutboxDriver[TTx], events ...event.Envelope) {
	t.Helper()
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, events...); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
}

func mustEvent(t *testing.T, key string) event.Envelope {
	t.Helper()
	e, err := event.New("Test.Happened.v1", key, map[string]string{"key": key})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestNewRelayRejects(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	if _, err := outbox.NewRelay[any](nil, pub, nil); err == nil {
		t.Error("NewRelay(nil driver) succeeded")
	}
	if _, err := outbox.NewRelay(drv, nil, nil); err == nil {
		t.Error("NewRelay(nil publisher) succeeded")
	}
	if _, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{BatchSize: -1}); err == nil {
		t.Error("NewRelay with a negative BatchSize succeeded")
	}
	if _, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{Lease: time.Millisecond}); err == nil {
		t.Error("NewRelay with a Lease of 1ms succeeded")
	}
}

// With the broker down, Run backs off round after round instead of trying
// every event in a tight loop.
func TestRunBacksOffWhileThePublisherFails(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	var events []event.Envelope
	for i := range 20 {
		events = append(events, mustEvent(t, string(rune('a'+i))))
	}
	enqueue(t, drv, events...)
	// Run ends 300ms after the first Publish: taking the lease and the
	// first claim took longer than that on a loaded machine.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var calls atomic.Int32
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error {
		if calls.Add(1) == 1 {
			time.AfterFunc(300*time.Millisecond, cancel)
		}
		return errDown
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return 50 * time.Millisecond },
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// One round per 50ms backoff: about 6 in 300ms. Without the relay's own
	// backoff every round would fail on the next event at once: 20+.
	if n := calls.Load(); n < 1 || n > 10 {
		t.Errorf("Publish called %d times in 300ms with a 50ms backoff; want about 6", n)
	}
}

// A failed event is retried when its backoff ends, not at the next poll.
func TestRunRetriesAtTheBackoffNotThePoll(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	var (
		mu    sync.Mutex
		calls int
		done  = make(chan time.Time, 1)
	)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return errDown
		}
		done <- time.Now()
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		PollInterval: 10 * time.Second,
		Backoff:      func(int) time.Duration { return 30 * time.Millisecond },
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, drv, mustEvent(t, "k"))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	go func() { _ = relay.Run(ctx) }()
	select {
	case at := <-done:
		t.Logf("published after one failure in %s", at.Sub(start))
	case <-time.After(3 * time.Second):
		t.Fatal("failed event not retried within 3s (backoff 30ms, poll 10s)")
	}
}

// A publisher that outlives the relay's context: the batch it published is
// still marked, so a restart does not publish it again. (A publish that
// fails because of the shutdown: TestInterruptedFailureNotCounted.)
func TestShutdownDuringPublishStillMarks(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	enqueue(t, drv, mustEvent(t, "k"))
	ctx, cancel := context.WithCancel(t.Context())
	var published atomic.Int32
	pub := outbox.PublisherFunc(func(_ context.Context, events []event.Envelope) error {
		cancel() // SIGTERM arrives while the broker acknowledges
		published.Add(int32(len(events)))
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RunOnce = %d, %v; want 1 published", n, err)
	}
	if _, ok, err := drv.Executor().OutboxOldestUnpublished(t.Context()); ok || err != nil {
		t.Errorf("after a shutdown during Publish, the event is still unpublished (%v)", err)
	}
}

// A round that published some events and failed others proves the broker
// up: the failed events wait for their own retry, and Run does not back off
// as a whole, which would hold up the keys that have no failure.
func TestRunDoesNotBackOffAfterPartialSuccess(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	published := make(chan event.Envelope, 10)
	pub := outbox.PublisherFunc(func(_ context.Context, events []event.Envelope) error {
		errs := make([]error, len(events))
		failed := false
		for i, e := range events {
			if e.Key == "bad" {
				errs[i], failed = errDown, true
				continue
			}
			published <- e
		}
		if failed {
			return &outbox.PublishError{Errs: errs}
		}
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		PollInterval: 10 * time.Millisecond,
		Backoff:      func(int) time.Duration { return 5 * time.Second },
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, drv, mustEvent(t, "bad"), mustEvent(t, "good-1"))
	runInBackground(t, relay)
	select {
	case <-published:
	case <-time.After(3 * time.Second):
		t.Fatal("good-1 not published within 3s")
	}
	enqueued := time.Now()
	enqueue(t, drv, mustEvent(t, "good-2"))
	select {
	case e := <-published:
		t.Logf("%s published %s after its commit", e.Key, time.Since(enqueued))
	case <-time.After(2 * time.Second):
		t.Fatal("good-2 not published within 2s (poll 10ms): the failure of key bad held up the whole relay")
	}
}

// downExecutor fails the relay's claim while down is set.
type downExecutor struct {
	driver.OutboxExecutor
	down   *atomic.Bool
	claims *atomic.Int32
}

func (e downExecutor) OutboxClaimBatch(ctx context.Context, p *driver.OutboxClaimBatchParams) ([]driver.OutboxRow, error) {
	e.claims.Add(1)
	if e.down.Load() {
		return nil, errors.New("database unreachable")
	}
	return e.OutboxExecutor.OutboxClaimBatch(ctx, p)
}

type downDriver struct {
	*sqlitedriver.Driver
	down   *atomic.Bool
	claims *atomic.Int32
}

func (d downDriver) Outbox() driver.OutboxExecutor {
	return downExecutor{d.Driver.Outbox(), d.down, d.claims}
}

// After a database outage the relay resumes within StorageBackoffCeiling,
// and at once on a wake-up, whatever its Backoff says (a long Backoff is for
// a broker that is down).
func TestRunResumesSoonAfterTheDatabase(t *testing.T) {
	t.Parallel()
	drv := downDriver{Driver: testdb.SQLite(t), down: new(atomic.Bool), claims: new(atomic.Int32)}
	drv.down.Store(true)
	published := make(chan event.Envelope, 10)
	pub := outbox.PublisherFunc(func(_ context.Context, es []event.Envelope) error {
		for _, e := range es {
			published <- e
		}
		return nil
	})
	wake := make(chan struct{}, 1)
	relay, err := outbox.NewRelay[*sql.Tx](drv, pub, &outbox.RelayConfig{
		Wake:         wake,
		PollInterval: time.Hour,
		Backoff:      func(int) time.Duration { return time.Hour },
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	for drv.claims.Load() < 2 { // failed twice: backing off by the ceiling
		time.Sleep(10 * time.Millisecond)
	}
	drv.down.Store(false)
	e := mustEvent(t, "k")
	enqueue(t, drv.Driver, e)
	watch := stallmeter.Start(t) // seconds without CPU are the machine's
	start := time.Now()
	wake <- struct{}{}
	select {
	case got := <-published:
		if got.ID != e.ID {
			t.Fatalf("published %s, want %s", got.ID, e.ID)
		}
		if d, stalled := time.Since(start), watch.Stop(); d > time.Second+stalled {
			t.Errorf("published %s after the wake-up (the process stalled %s), want at once", d, stalled)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("not published 30 s after the database came back and a wake-up")
	}
}

// flakyNotifier is a driver whose first ListenOutbox fails (the database
// restarting as the relay starts).
type flakyNotifier struct {
	*sqlitedriver.Driver
	calls atomic.Int32
	wake  chan struct{}
}

func (n *flakyNotifier) ListenOutbox(context.Context, func(error)) (<-chan struct{}, error) {
	if n.calls.Add(1) == 1 {
		return nil, errors.New("connection refused")
	}
	return n.wake, nil
}

// A relay whose listener fails as Run starts listens again later, instead
// of polling for the rest of its life: with a poll interval of an hour, an
// event is published on the wake-up of the listener obtained by the retry.
func TestRunListensAgainAfterAFailedStart(t *testing.T) {
	t.Parallel()
	drv := &flakyNotifier{Driver: testdb.SQLite(t), wake: make(chan struct{}, 1)}
	published := make(chan struct{}, 10)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		PollInterval: time.Hour,
		OnPublished:  func([]event.Envelope) { published <- struct{}{} },
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, relay)
	deadline := time.Now().Add(3 * time.Second)
	for drv.calls.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("ListenOutbox called %d times in 3s; the relay polls only after a failed start", drv.calls.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	enqueue(t, drv.Driver, mustEvent(t, "k"))
	drv.wake <- struct{}{}
	select {
	case <-published:
	case <-time.After(3 * time.Second):
		t.Fatal("the event was not published on a wake-up of the listener obtained by the retry")
	}
}

// With a Backoff of 0, a failing relay still waits at least 10ms between
// rounds (the jitter applied to the floor made it 5-10ms).
func TestRunWaitsAtLeastTheFloor(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	enqueue(t, drv, mustEvent(t, "k"))
	var (
		mu    sync.Mutex
		calls []time.Time
	)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, time.Now())
		return errDown
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return 0 },
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	// Long enough for a loaded machine to run a few rounds.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := relay.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) < 3 {
		t.Fatalf("Publish called %d times in 2s", len(calls))
	}
	shortest := time.Hour
	for i := 1; i < len(calls); i++ {
		shortest = min(shortest, calls[i].Sub(calls[i-1]))
	}
	if shortest < 10*time.Millisecond {
		t.Errorf("shortest wait between two failed rounds %s (of %d); want at least 10ms", shortest, len(calls))
	}
}

// On SQLite (no locking mode), the transaction of a round's marks is
// rolled back, when a mark fails, before RunOnce returns: the context it
// was begun on is still live at the Rollback. It used to end first, so
// database/sql rolled back asynchronously, the explicit Rollback returned
// at once, and the database's write lock could still be held after
// RunOnce returned: the next writer (another process's, or this one's
// next round) waited for it, or failed with SQLITE_BUSY.
func TestMarksRollBackBeforeTheirContextEndsSQLite(t *testing.T) {
	t.Parallel()
	checkRollbackBeforeContextEnds(t, testdb.SQLite(t), 1)
}

// runInBackground runs relay until the test ends: its cleanup cancels Run
// and waits for it to return.
func runInBackground[TTx any](t *testing.T, relay *outbox.Relay[TTx]) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// A round the publisher skips right after a database outage backs off as
// the first publish failure it is, not as the outage's n-th failure: the
// failures of the database and those of the publisher are counted apart.
// Before, a relay with DefaultBackoff that failed 10 rounds in the
// database (a few seconds of outage) then met one skipped round (idemd's
// embedded broker holds events back until its lease, renewed on the same
// database, is renewed again) slept Backoff(11), the full minute, and
// published nothing meanwhile; the assembled idemd left 285 of 300 orders
// unsettled 46s after such an outage.
func TestRunPublishBackoffAfterADatabaseOutage(t *testing.T) {
	t.Parallel()
	drv := downDriver{Driver: testdb.SQLite(t), down: new(atomic.Bool), claims: new(atomic.Int32)}
	drv.down.Store(true)
	var skips atomic.Int32
	published := make(chan event.Envelope, 10)
	pub := outbox.PublisherFunc(func(_ context.Context, es []event.Envelope) error {
		if skips.Add(1) == 1 { // the first round after the outage
			errs := make([]error, len(es))
			for i := range errs {
				errs[i] = outbox.ErrSkipped
			}
			return &outbox.PublishError{Errs: errs}
		}
		for _, e := range es {
			published <- e
		}
		return nil
	})
	wake := make(chan struct{}, 1)
	relay, err := outbox.NewRelay[*sql.Tx](drv, pub, &outbox.RelayConfig{
		Wake:         wake,
		PollInterval: time.Hour,
		// DefaultBackoff's shape, faster: 1ms doubling up to 3s (the
		// outage's failures wait StorageBackoffCeiling at most and are
		// woken at once).
		Backoff: func(n int) time.Duration { return min(time.Millisecond<<min(n-1, 20), 3*time.Second) },
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	for drv.claims.Load() < 12 { // the outage: 12 failed rounds
		select {
		case wake <- struct{}{}:
		default:
		}
		time.Sleep(time.Millisecond)
	}
	e := mustEvent(t, "k")
	drv.down.Store(false)
	enqueue(t, drv.Driver, e)
	watch := stallmeter.Start(t) // seconds without CPU are the machine's
	start := time.Now()
	wake <- struct{}{}
	select {
	case got := <-published:
		if got.ID != e.ID {
			t.Fatalf("published %s, want %s", got.ID, e.ID)
		}
		// The skipped round's backoff is Backoff(1) = 1ms (10ms at
		// least); Backoff(13) is the ceiling, 3s (1.5-3s with jitter).
		if d, stalled := time.Since(start), watch.Stop(); d > time.Second+stalled {
			t.Errorf("published %s after the database came back and one skipped round (the process stalled %s); want the first publish failure's backoff (ms), not the outage's 13th (1.5-3s)",
				d.Round(time.Millisecond), stalled)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("not published 30s after the database came back")
	}
}
