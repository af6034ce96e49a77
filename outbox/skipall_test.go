package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// A publisher that holds back a whole batch, every event ErrSkipped (a
// circuit breaker open, a rate limit: "not now", without counting an
// attempt against MaxAttempts), made Run hand the same batch over again at
// once, round after round: 240 to 446 Publish calls in 500ms (one driver to
// another), a busy loop on the database and the broker client. Such a round is a failed round: Run backs
// off, RunOnce returns an error, a warning says so (once per 30s), and no
// attempt is counted, so the events go out once the publisher takes them.
func TestRunBacksOffWhenThePublisherSkipsEverything(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testSkipAll[*sql.Tx](t, testdb.SQLite(t))
	})
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testSkipAll[pgx.Tx](t, testdb.Postgres(t))
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		testSkipAll[*sql.Tx](t, testdb.PostgresSQL(t))
	})
}

func testSkipAll[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	a, b := mustEvent(t, "skip-a"), mustEvent(t, "skip-b")
	enqueueTx(t, drv, a, b)
	var (
		calls     atomic.Int32
		skip      atomic.Bool
		published atomic.Int32
		logs      testlog.Buffer
	)
	skip.Store(true)
	var onFirst atomic.Pointer[func()] // called on the first call after calls.Store(0)
	pub := outbox.PublisherFunc(func(_ context.Context, es []event.Envelope) error {
		if calls.Add(1) == 1 {
			if f := onFirst.Swap(nil); f != nil {
				(*f)()
			}
		}
		if !skip.Load() {
			published.Add(int32(len(es)))
			return nil
		}
		errs := make([]error, len(es))
		for i := range errs {
			errs[i] = outbox.ErrSkipped
		}
		return &outbox.PublishError{Errs: errs}
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff:     func(int) time.Duration { return 100 * time.Millisecond },
		MaxAttempts: 1, // a skip is no attempt: nothing is parked
		NoListen:    true,
		Logger:      slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}

	if n, err := relay.RunOnce(t.Context()); n != 0 || !errors.Is(err, outbox.ErrSkipped) {
		t.Errorf("RunOnce with every event skipped = %d, %v; want 0 and an error wrapping ErrSkipped", n, err)
	}
	// Run ends 500ms after its first Publish: taking the lease and the
	// first claim took longer than that on a loaded machine.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	calls.Store(0)
	endSoon := func() { time.AfterFunc(500*time.Millisecond, cancel) }
	onFirst.Store(&endSoon)
	if err := relay.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// A round per backoff (50-100ms) and worker: at most 20 in 500ms.
	if n := calls.Load(); n < 1 || n > 30 {
		t.Errorf("Publish called %d times in 500ms while it skipped every event, with a 100ms backoff; want a few", n)
	}

	// Not silent, and not a line per round: one warning (the repeats
	// within 30s are counted).
	if n := strings.Count(logs.String(), "skipped every event of the round"); n != 1 {
		t.Errorf("%d warnings of the skipped rounds; want 1; logs:\n%s", n, logs.String())
	}

	// Once the publisher takes them, they go out within moments; not
	// always in the very next round (seen: 0 for up to 0.4s, 17 times in
	// 80 runs on a loaded machine): Run's last rounds, cut short by its
	// end, may hold the rows a moment longer.
	skip.Store(false)
	total := 0
	for deadline := time.Now().Add(10 * time.Second); total < 2 && time.Now().Before(deadline); {
		n, err := relay.RunOnce(t.Context())
		if err != nil {
			t.Fatalf("RunOnce once the publisher takes the events: %v", err)
		}
		total += n
		if n == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if total != 2 || published.Load() != 2 {
		t.Errorf("RunOnce once the publisher takes the events published %d (the publisher got %d) within 10s; want 2", total, published.Load())
	}
	if n, err := outbox.CountParked(t.Context(), drv); n != 0 || err != nil {
		t.Errorf("CountParked = %d, %v; want 0 (skips are not attempts)", n, err)
	}
}
