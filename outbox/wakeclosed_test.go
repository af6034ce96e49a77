package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// A Wake channel that its owner closes (a fan-in of signals that ends with
// its own context) receives at once, for ever: Run must not take that for
// an endless stream of wake-ups and claim in a tight loop.
func TestRunIgnoresAClosedWake(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 2} {
		drv := downDriver{Driver: testdb.SQLite(t), down: new(atomic.Bool), claims: new(atomic.Int32)}
		wake := make(chan struct{})
		close(wake)
		pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
		relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{PollInterval: time.Hour, Wake: wake, Concurrency: concurrency})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		if err := relay.Run(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		if n := drv.claims.Load(); n > 5 {
			t.Errorf("Concurrency %d: %d claims in 300ms with an empty outbox and a poll interval of an hour; want the closed Wake ignored", concurrency, n)
		}
	}
}
