package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// A round stuck in Publish (kgo keeps a record whose outcome the broker has
// not told, whatever the context says: a broker that died mid-request)
// reported no lag until it ended: OnLag was called after rounds only, so
// the lag gauge froze at its last value, the age of the oldest event went
// unreported, and an alert on the lag stayed silent for as long as Kafka
// was down. Run now reports the lag every PollInterval however long a
// round takes.
func TestRunReportsTheLagWhileARoundIsStuck(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testLagWhileStuck[*sql.Tx](t, testdb.SQLite(t))
	})
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testLagWhileStuck[pgx.Tx](t, testdb.Postgres(t))
	})
}

func testLagWhileStuck[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	enqueueTx(t, drv, mustEvent(t, "k"))
	entered := make(chan struct{})
	release := make(chan struct{})
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error {
		close(entered)
		<-release // outlives its context
		return nil
	})
	var lag atomic.Int64
	lag.Store(-1)
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		NoListen:       true,
		Concurrency:    1, // on PostgreSQL, every worker stuck
		PollInterval:   50 * time.Millisecond,
		PublishTimeout: 100 * time.Millisecond,
		OnLag:          func(d time.Duration) { lag.Store(int64(d)) },
		Logger:         slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(ctx)
	}()
	defer func() { cancel(); close(release); <-done }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish not called in 10s")
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Duration(lag.Load()) < time.Second {
		if time.Now().After(deadline) {
			t.Fatalf("OnLag's last value is %s 5s into a Publish that does not return, the event waiting since before it; want the lag reported (1s and more) while the round is stuck",
				time.Duration(lag.Load()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
