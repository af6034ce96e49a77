package cleanup_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/saga"
)

func Example() {
	dir, _ := os.MkdirTemp("", "idem-cleanup-example")
	defer os.RemoveAll(dir)
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	ctx := context.Background()
	if err := drv.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	// Two events processed four days ago, one an hour ago.
	now := time.Now()
	var processedAt time.Time
	ib, err := inbox.New(drv, &inbox.Config{
		Consumer: "order-projection",
		Now:      func() time.Time { return processedAt },
	})
	if err != nil {
		log.Fatal(err)
	}
	noop := func(context.Context, *sql.Tx) error { return nil } // the effect
	for _, at := range []time.Time{now.Add(-96 * time.Hour), now.Add(-96 * time.Hour), now.Add(-time.Hour)} {
		processedAt = at
		if _, err := ib.Process(ctx, uuid.New(), noop); err != nil {
			log.Fatal(err)
		}
	}

	// A saga that completed four days ago, and one still running.
	fourDaysAgo := func() time.Time { return now.Add(-96 * time.Hour) }
	sagas, err := saga.New(drv, &saga.Config{Now: fourDaysAgo})
	if err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"order-1", "order-2"} {
		tx, err := drv.Begin(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if _, _, err := sagas.StartTx(ctx, tx, id, "order", nil); err != nil {
			log.Fatal(err)
		}
		if id == "order-1" {
			if err := sagas.CompleteTx(ctx, tx, id); err != nil {
				log.Fatal(err)
			}
		}
		if err := drv.Commit(ctx, tx); err != nil {
			log.Fatal(err)
		}
	}

	c, err := cleanup.New(drv, &cleanup.Config{
		Inbox: cleanup.InboxRetention{
			TTL:               72 * time.Hour,
			RedeliveryHorizon: 72 * time.Hour, // the topic's retention
		},
		// Finished sagas: kept 72h after they finished (the default).
		Sagas:    cleanup.SagaRetention{TTL: 72 * time.Hour},
		Schedule: "0 3 * * *", // Run: daily at 03:00 (the default)
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err) // a retention outside 24h..72h or a bad cron expression
	}
	rep, err := c.RunOnce(ctx) // or go c.Run(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range rep.Tables {
		fmt.Printf("%s: %d deleted\n", t.Table, t.Deleted)
	}
	// Output:
	// idempotency_record: 0 deleted
	// processed_event: 2 deleted
	// outbox: 0 deleted
	// saga: 1 deleted
}
