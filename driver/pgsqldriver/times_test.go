package pgsqldriver_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgsqldriver"
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

// Without Config.Schema, the outbox's channel (and lane locks) are named
// after the schema found through search_path, as for a driver naming it:
// a listener of either is woken by an enqueue of the other, and the relay
// claims with them.
func TestOutboxSchemaFromSearchPath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, schema := testdb.SQLDB(t, 4)
	drv, err := pgsqldriver.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	named, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	wake, err := named.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	enqueueOne(t, drv)
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Error("a listener naming the schema was not woken by an enqueue of a driver finding it through search_path")
	}
	if a, b := drv.OutboxChannel(), named.OutboxChannel(); a != b {
		t.Errorf("OutboxChannel without Schema = %q, with Schema = %q; want the same", a, b)
	}
	published := 0
	relay, err := outbox.NewRelay(drv, outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		published += len(batch)
		return nil
	}), &outbox.RelayConfig{NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil || published != 1 {
		t.Errorf("RunOnce: published %d, %v; want 1", published, err)
	}
}
