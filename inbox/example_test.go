package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/inbox"
)

// A consumer credits an account once per PaymentReceived event, however
// often the broker delivers it. With PostgreSQL the same code takes a pgx.Tx.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "inbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = drv.Close() }()
	if err := drv.Migrate(ctx); err != nil { // creates processed_event
		log.Fatal(err)
	}
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE account (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
		INSERT INTO account VALUES ('acc-1', 0)`); err != nil {
		log.Fatal(err)
	}

	ib, err := inbox.New(drv, &inbox.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	credit := func(ctx context.Context, tx *sql.Tx) error {
		// The effect goes through tx: it commits with the dedup row.
		_, err := tx.ExecContext(ctx, `UPDATE account SET balance = balance + 100 WHERE id = 'acc-1'`)
		return err
	}

	eventID := uuid.MustParse("0190a5c4-6a3e-7b1d-9c2e-3f4a5b6c7d8e") // from the event envelope
	for delivery := 1; delivery <= 3; delivery++ {
		applied, err := ib.Process(ctx, eventID, credit)
		if err != nil {
			log.Fatal(err) // do not commit the offset: the event comes again
		}
		fmt.Printf("delivery %d applied: %v\n", delivery, applied)
		// Commit the broker offset here, after Process returned nil.
	}

	var balance int
	if err := drv.DB().QueryRowContext(ctx, `SELECT balance FROM account WHERE id = 'acc-1'`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// delivery 1 applied: true
	// delivery 2 applied: false
	// delivery 3 applied: false
	// balance: 100
}

// A batch of events polled from one partition: one transaction, one INSERT
// for all IDs, the handler for the new ones only.
func ExampleInbox_ProcessBatch() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "inbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = drv.Close() }()
	if err := drv.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(drv, &inbox.Config{Consumer: "order-projection"})
	if err != nil {
		log.Fatal(err)
	}

	a := uuid.MustParse("0190a5c4-6a3e-7b1d-9c2e-00000000000a")
	b := uuid.MustParse("0190a5c4-6a3e-7b1d-9c2e-00000000000b")
	handle := func(ctx context.Context, tx *sql.Tx, e inbox.Event) error {
		fmt.Println("apply", e.Payload)
		return nil // write the projection through tx
	}
	res, err := ib.ProcessBatch(ctx, []inbox.Event{{ID: a, Payload: "OrderCreated"}, {ID: b, Payload: "OrderPaid"}, {ID: a, Payload: "OrderCreated"}}, handle)
	if err != nil {
		log.Fatal(err) // an *inbox.EventError names the failing event
	}
	fmt.Printf("%+v\n", res)
	res, _ = ib.ProcessBatch(ctx, []inbox.Event{{ID: b, Payload: "OrderPaid"}}, handle) // redelivered
	fmt.Printf("%+v\n", res)
	// Output:
	// apply OrderCreated
	// apply OrderPaid
	// {Applied:2 Duplicates:1}
	// {Applied:0 Duplicates:1}
}
