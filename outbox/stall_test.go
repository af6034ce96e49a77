package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// holdSpy records the HoldTimeout of the relay's claims.
type holdSpy[TTx any] struct {
	driver.OutboxDriver[TTx]
	hold atomic.Int64
}

func (d *holdSpy[TTx]) OutboxTx(tx TTx) driver.OutboxExecutor {
	return holdSpyEx{d.OutboxDriver.OutboxTx(tx), &d.hold}
}

type holdSpyEx struct {
	driver.OutboxExecutor
	hold *atomic.Int64
}

func (e holdSpyEx) OutboxClaimBatch(ctx context.Context, p *driver.OutboxClaimBatchParams) ([]driver.OutboxRow, error) {
	e.hold.Store(int64(p.HoldTimeout))
	return e.OutboxExecutor.OutboxClaimBatch(ctx, p)
}

// A relay stalled in the middle of a batch (a broker client ignoring its
// context, the network to the database gone) held its lanes forever: its
// claim transaction stayed open, idle, and the other relays skipped those
// lanes, so up to half the keys stopped. The claim now bounds how long its
// transaction may stay idle: the server ends the stalled session, and
// another relay publishes its events.
func TestStalledClaimFreesItsLanes(t *testing.T) {
	t.Parallel()
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testStalledClaim(t, testdb.Postgres(t))
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		testStalledClaim(t, testdb.PostgresSQL(t))
	})
}

func testStalledClaim[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	ctx := t.Context()
	events := []event.Envelope{mustEvent(t, "k"), mustEvent(t, "k")}
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

	// Relay A claims the events, then stalls: it never marks them. The
	// test process itself may stall past the 300ms while the claim runs
	// (with the machine busy, the server ended the session during the
	// claim: idle-in-transaction timeout): A claims again then.
	var stalled TTx
	for try := 1; ; try++ {
		stalled, err = drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := drv.OutboxTx(stalled).OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{
			Now: time.Now(), Limit: 10, HoldTimeout: 300 * time.Millisecond,
		})
		if err == nil && len(rows) == len(events) {
			break
		}
		_ = drv.Rollback(context.Background(), stalled)
		if err == nil || !strings.Contains(err.Error(), "25P03") || try == 5 {
			t.Fatalf("claim = %d rows, %v; want %d", len(rows), err, len(events))
		}
		t.Logf("claim, try %d: %v", try, err)
	}
	defer func() { _ = drv.Rollback(context.Background(), stalled) }()

	// Relay B skips the lanes A holds until the server ends A's session.
	spy := &holdSpy[TTx]{OutboxDriver: drv}
	var published []event.Envelope
	relay, err := outbox.NewRelay[TTx](spy, outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		published = append(published, batch...)
		return nil
	}), &outbox.RelayConfig{NoListen: true, PublishTimeout: 7 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	watch := stallmeter.Start(t) // seconds without CPU are the machine's
	began := time.Now()
	for len(published) < len(events) {
		if stalled := watch.Stalled(); time.Since(began) > 4*time.Second+stalled {
			t.Fatalf("relay B published %d of A's %d events in 4s (and %s the process stalled); A's stalled claim still holds their lane", len(published), len(events), stalled)
		}
		if _, err := relay.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, e := range published {
		if e.ID != events[i].ID {
			t.Errorf("published event %d is %s, want %s (same IDs, same order)", i, e.ID, events[i].ID)
		}
	}
	if err := drv.Commit(ctx, stalled); err == nil {
		t.Error("the stalled claim's transaction committed; want it ended by the server")
	}
	if hold := time.Duration(spy.hold.Load()); hold <= 7*time.Second || hold > time.Minute {
		t.Errorf("the relay's claim HoldTimeout is %s with a PublishTimeout of 7s; want a bit more than the PublishTimeout", hold)
	}
}
