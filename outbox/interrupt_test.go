package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// A publish that fails because the relay is shutting down does not count
// as an attempt: with MaxAttempts 1 the event is neither parked nor backed
// off, and the next relay publishes it at once.
func TestInterruptedFailureNotCounted(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	enqueue(t, drv, mustEvent(t, "k"))
	ctx, cancel := context.WithCancel(t.Context())
	failing := outbox.PublisherFunc(func(context.Context, []event.Envelope) error {
		cancel()
		return errors.New("broker connection closed by shutdown")
	})
	r1, err := outbox.NewRelay(drv, failing, &outbox.RelayConfig{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = r1.RunOnce(ctx)
	ok := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	r2, err := outbox.NewRelay(drv, ok, &outbox.RelayConfig{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r2.RunOnce(t.Context()); n != 1 || err != nil {
		t.Fatalf("after a shutdown-interrupted publish, RunOnce = %d, %v; want the event published", n, err)
	}
}

func TestRedriveNilDriver(t *testing.T) {
	t.Parallel()
	if _, err := outbox.Redrive[*sql.Tx](t.Context(), nil, outbox.RedriveOptions{}); err == nil {
		t.Fatal("Redrive with a nil driver: no error")
	}
}
