package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// After a broker outage, the events that failed during it are published
// as soon as the relay publishes again, not after the backoff each reached
// during the outage (up to Backoff's longest: a minute by default). And
// the relay itself tries again within PublishBackoffCeiling, however long
// the outage: before, a one-minute outage left the relay asleep and the
// outage's events backing off for up to a minute after the broker's
// return (seen in idemd's soak, orders still CREATED 45 s after it).
func TestRunAfterAPublishOutage(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testRunAfterAPublishOutage(t, testdb.SQLite(t))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		testRunAfterAPublishOutage(t, testdb.Postgres(t))
	})
}

func testRunAfterAPublishOutage[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	var (
		down      atomic.Bool
		attempts  atomic.Int32
		mu        sync.Mutex
		published = map[string]time.Time{}
	)
	down.Store(true)
	pub := outbox.PublisherFunc(func(_ context.Context, es []event.Envelope) error {
		attempts.Add(int32(len(es)))
		if down.Load() {
			return errDown
		}
		mu.Lock()
		defer mu.Unlock()
		for _, e := range es {
			published[e.ID.String()] = time.Now()
		}
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		PollInterval: 100 * time.Millisecond,
		// Every failure waits a minute, as DefaultBackoff's longest.
		Backoff: func(int) time.Duration { return time.Minute },
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	var outage []event.Envelope
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		outage = append(outage, mustEvent(t, k))
	}
	enqueueTx(t, drv, outage...)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// The outage: every event failed once, and backs off for a minute.
	deadline := time.Now().Add(20 * time.Second)
	for attempts.Load() < int32(len(outage)) {
		if time.Now().After(deadline) {
			t.Fatalf("%d publish attempts in 20 s; want the %d events tried", attempts.Load(), len(outage))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Their failures are marked once no publish was tried for a second
	// (the relay sleeps: its events back off).
	for n := attempts.Load(); ; {
		time.Sleep(time.Second)
		m := attempts.Load()
		if m == n {
			break
		}
		n = m
	}
	// The broker is back, and the service goes on enqueueing.
	down.Store(false)
	back := time.Now()
	fresh := mustEvent(t, "f")
	enqueueTx(t, drv, fresh)

	want := append(outage, fresh)
	const bound = 20 * time.Second // PublishBackoffCeiling is 5 s; a minute before
	for {
		mu.Lock()
		n := 0
		var last time.Time
		for _, e := range want {
			if at, ok := published[e.ID.String()]; ok {
				n++
				if at.After(last) {
					last = at
				}
			}
		}
		mu.Unlock()
		if n == len(want) {
			t.Logf("all %d events published %.1f s after the broker's return", n, last.Sub(back).Seconds())
			return
		}
		if time.Since(back) > bound {
			mu.Lock()
			for _, e := range want {
				if _, ok := published[e.ID.String()]; !ok {
					t.Logf("not published: key %s", e.Key)
				}
			}
			mu.Unlock()
			t.Fatalf("%d of %d events published %v after the broker's return; want all (the outage's events must not wait out their minute of backoff)",
				n, len(want), bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slowClaimDriver is a SQLite driver whose claims take delay (a claim
// over a backlog of millions whose keys all back off).
type slowClaimDriver struct {
	*sqlitedriver.Driver
	delay time.Duration
}

type slowClaimExecutor struct {
	driver.OutboxExecutor
	delay time.Duration
}

func (d slowClaimDriver) Outbox() driver.OutboxExecutor {
	return slowClaimExecutor{d.Driver.Outbox(), d.delay}
}

func (e slowClaimExecutor) OutboxClaimBatch(ctx context.Context, p *driver.OutboxClaimBatchParams) ([]driver.OutboxRow, error) {
	time.Sleep(e.delay)
	return e.OutboxExecutor.OutboxClaimBatch(ctx, p)
}

// During a broker outage a relay whose claims are slow waits at least ten
// times a claim's duration between failed rounds (up to its Backoff), not
// PublishBackoffCeiling, so that the outage's claims do not keep the
// database busy.
func TestRunPublishOutageWithSlowClaims(t *testing.T) {
	t.Parallel()
	const delay = 1500 * time.Millisecond
	drv := slowClaimDriver{Driver: testdb.SQLite(t), delay: delay}
	enqueue(t, drv.Driver, mustEvent(t, "k"))
	var (
		mu    sync.Mutex
		calls []time.Time
	)
	// Every event skipped (a circuit breaker open): the round fails as a
	// whole, no attempt is counted, and the event is claimed again at the
	// next round, spaced only by the relay's own wait.
	pub := outbox.PublisherFunc(func(_ context.Context, es []event.Envelope) error {
		mu.Lock()
		calls = append(calls, time.Now())
		mu.Unlock()
		errs := make([]error, len(es))
		for i := range errs {
			errs[i] = outbox.ErrSkipped
		}
		return &outbox.PublishError{Errs: errs}
	})
	relay, err := outbox.NewRelay[*sql.Tx](drv, pub, &outbox.RelayConfig{
		PollInterval: 50 * time.Millisecond,
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
	deadline := time.Now().Add(40 * time.Second)
	for {
		mu.Lock()
		n := len(calls)
		var gap time.Duration
		if n >= 2 {
			gap = calls[1].Sub(calls[0])
		}
		mu.Unlock()
		if n >= 2 {
			// The wait is 15 s (ten claims of 1.5 s), jittered to 7.5-15 s,
			// plus the next claim's 1.5 s; PublishBackoffCeiling alone
			// would give 2.5-5 s plus the claim.
			t.Logf("two rounds of a publish outage %.1f s apart, with claims of %s", gap.Seconds(), delay)
			if gap < 8*time.Second {
				t.Errorf("rounds %.1f s apart with claims of %s; want at least 9 s (ten claims' time, jittered, plus a claim)", gap.Seconds(), delay)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d publish calls in 40 s; want 2", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
