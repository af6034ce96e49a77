package outbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// The business transaction enqueues its event; the relay publishes it after
// the commit. (A Kafka publisher takes the place of the PublisherFunc.)
func Example() {
	dir, _ := os.MkdirTemp("", "idem-outbox-example")
	defer func() { _ = os.RemoveAll(dir) }()
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		panic(err)
	}
	defer func() { _ = drv.Close() }()
	ctx := context.Background()
	if err := drv.Migrate(ctx); err != nil {
		panic(err)
	}

	// In the handler: business writes and the event, one transaction.
	tx, err := drv.Begin(ctx)
	if err != nil {
		panic(err)
	}
	e, err := event.New("OrderCreated.v1", "order-42", map[string]string{"amount": "99.9000"})
	if err != nil {
		panic(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil {
		panic(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		panic(err)
	}

	// In the relay process (usually relay.Run(ctx) for the process's life).
	pub := outbox.PublisherFunc(func(_ context.Context, events []event.Envelope) error {
		for _, e := range events {
			fmt.Println("publish", e.Type, e.Key, string(e.Payload))
		}
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, nil)
	if err != nil {
		panic(err)
	}
	n, err := relay.RunOnce(ctx)
	fmt.Println("published:", n, err)
	n, err = relay.RunOnce(ctx)
	fmt.Println("published again:", n, err)
	// Output:
	// publish OrderCreated.v1 order-42 {"amount":"99.9000"}
	// published: 1 <nil>
	// published again: 0 <nil>
}
