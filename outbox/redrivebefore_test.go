package outbox_test

import (
	"context"
	"database/sql"
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

// RedriveOptions.Before leaves alone the events published at or after it:
// one published 10 s after another, a Redrive before the middle changes
// the first only, and one without Before the second.
func TestRedriveBefore(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testRedriveBefore[*sql.Tx](t, testdb.SQLite(t))
	})
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testRedriveBefore[pgx.Tx](t, testdb.Postgres(t))
	})
}

func testRedriveBefore[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	ctx := t.Context()
	var (
		mu   sync.Mutex
		now  = time.Now().Add(-time.Minute).Truncate(time.Second)
		sent []string
	)
	pub := outbox.PublisherFunc(func(_ context.Context, events []event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range events {
			sent = append(sent, e.Key)
		}
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Now:    func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(key string) {
		t.Helper()
		enqueueTx(t, drv, mustEvent(t, key))
		if n, err := relay.RunOnce(ctx); n != 1 || err != nil {
			t.Fatalf("RunOnce = %d, %v; want %s published", n, err, key)
		}
	}
	t0 := now
	publish("a")
	mu.Lock()
	now = t0.Add(10 * time.Second)
	mu.Unlock()
	publish("b")
	if n, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{Before: t0.Add(5 * time.Second)}); err != nil || n != 1 {
		t.Fatalf("Redrive(Before: between them) = %d, %v; want 1 (a)", n, err)
	}
	if n, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{}); err != nil || n != 1 {
		t.Fatalf("Redrive() = %d, %v; want 1 (b; a is unpublished)", n, err)
	}
	mu.Lock()
	sent = nil
	mu.Unlock()
	for range 3 {
		if n, err := relay.RunOnce(ctx); n == 0 && err == nil {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 || sent[0] != "a" || sent[1] != "b" {
		t.Errorf("after the redrives the relay published %v; want [a b]", sent)
	}
}
