package pgsqldriver_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// An event's OccurredAt comes back from the outbox as it went in: with a
// UTC offset of seconds (Europe/Amsterdam until 1937 was +00:19:32, whose
// seconds were dropped) and in year 0000 (1 BC, which Validate accepts and
// PostgreSQL's text input refused, failing the whole enqueue).
func TestOutboxKeepsOccurredAt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := testdb.PostgresSQL(t)
	amsterdam := time.FixedZone("AMT", 19*60+32)
	times := []time.Time{
		time.Date(1930, 5, 1, 12, 0, 0, 0, amsterdam),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 3, 23, 59, 59, 123456000, time.UTC),
	}
	var events []event.Envelope
	for _, at := range times {
		e, err := event.New("Test.Happened.v1", "k", map[string]string{"a": "b"})
		if err != nil {
			t.Fatal(err)
		}
		e.OccurredAt = at
		events = append(events, e)
	}
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, events...); err != nil {
		_ = drv.Rollback(ctx, tx)
		t.Fatalf("EnqueueTx: %v", err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	var got []event.Envelope
	relay, err := outbox.NewRelay(drv, outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		got = append(got, batch...)
		return nil
	}), &outbox.RelayConfig{NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(times) {
		t.Fatalf("published %d events, want %d", len(got), len(times))
	}
	for i, e := range got {
		if !e.OccurredAt.Equal(times[i]) {
			t.Errorf("event %d: OccurredAt %s, want %s", i, e.OccurredAt.UTC(), times[i].UTC())
		}
	}
}
