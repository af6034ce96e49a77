package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// The relays stamp parks and publications with their own clock
// (RelayConfig.Now). Unpark and Redrive run elsewhere (an operator's
// command), on a clock that may be behind theirs: they still find every
// event parked or published before they started, and the relay publishes
// those events again.
func TestUnparkAndRedriveWithTheRelayClockAhead(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testClockAhead[*sql.Tx](t, testdb.SQLite(t))
	})
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testClockAhead[pgx.Tx](t, testdb.Postgres(t))
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		testClockAhead[*sql.Tx](t, testdb.PostgresSQL(t))
	})
}

func testClockAhead[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	ctx := t.Context()
	var (
		mu     sync.Mutex
		poison = true
		sent   []string
	)
	pub := outbox.PublisherFunc(func(_ context.Context, events []event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		errs := make([]error, len(events))
		for i, e := range events {
			if e.Key == "p" && poison {
				errs[i] = fmt.Errorf("refused: %w", outbox.ErrPoison)
				continue
			}
			sent = append(sent, e.Key)
		}
		for i, err := range errs {
			if err != nil {
				return outbox.PrefixError(len(events), i, err)
			}
		}
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Now:    func() time.Time { return time.Now().Add(time.Hour) },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	drain := func() {
		t.Helper()
		for range 10 {
			// A round that parks the poison event fails; the next one
			// finds nothing.
			n, err := relay.RunOnce(ctx)
			if n == 0 && err == nil {
				return
			}
		}
		t.Fatal("the relay still publishes after 10 rounds")
	}
	enqueueTx(t, drv, mustEvent(t, "q"))
	enqueueTx(t, drv, mustEvent(t, "p"))
	drain()
	if n, err := outbox.CountParked(ctx, drv); err != nil || n != 1 {
		t.Fatalf("CountParked = %d, %v; want the poison event parked", n, err)
	}
	// An hour behind the relay's clock, the park and the publication are
	// "in the future": they were made before Unpark and Redrive started
	// all the same.
	mu.Lock()
	poison = false
	sent = nil
	mu.Unlock()
	if n, err := outbox.Unpark(ctx, drv, outbox.UnparkOptions{All: true}); err != nil || n != 1 {
		t.Errorf("Unpark(All) = %d, %v; want the event parked by a relay whose clock is ahead", n, err)
	}
	if n, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{}); err != nil || n != 1 {
		t.Errorf("Redrive = %d, %v; want the event published by a relay whose clock is ahead", n, err)
	}
	drain()
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 {
		t.Errorf("after Unpark and Redrive the relay published %v; want q and p again", sent)
	}
}
