package pgsqldriver_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// TestBehindPgBouncer runs its subtests through one PgBouncer in
// transaction pooling mode (each PgBouncer takes connection slots of the
// tests' for as long as it runs: see testdb.PgBouncer).
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer := testdb.PgBouncer(t)
	t.Run("Driver", func(t *testing.T) { behindPgBouncerDriver(t, bouncer) })
	t.Run("ListenOutbox", func(t *testing.T) { behindPgBouncerListenOutbox(t, bouncer) })
}

// The driver's whole shared suite through PgBouncer in transaction
// pooling mode (see pgdriver's TestBehindPgBouncerDriver).
func behindPgBouncerDriver(t *testing.T, bouncer string) {
	t.Parallel()
	drivertest.Run(t, drivertest.Backend[*sql.Tx]{
		New: func(t *testing.T) driver.Driver[*sql.Tx] {
			drv, _ := testdb.PostgresSQLBehindPgBouncer(t, bouncer)
			return drv
		},
		NewUnmigrated: func(t *testing.T) driver.Driver[*sql.Tx] {
			_, schema := testdb.Schema(t, 2)
			drv, err := pgsqldriver.New(testdb.BouncerSQLDB(t, bouncer, 10), &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return drv
		},
	})
}

// Behind PgBouncer in transaction mode ListenOutbox refuses the *sql.DB's
// settings (errors.ErrUnsupported: the relay polls) and listens on
// Config.ListenConnConfig, a direct connection.
func behindPgBouncerListenOutbox(t *testing.T, bouncer string) {
	t.Parallel()
	ctx := t.Context()
	drv, schema := testdb.PostgresSQLBehindPgBouncer(t, bouncer)
	if _, err := drv.ListenOutbox(ctx, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("ListenOutbox through PgBouncer without ListenConnConfig: %v; want an error wrapping errors.ErrUnsupported", err)
	}
	direct, err := pgx.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	listening, err := pgsqldriver.New(drv.DB(), &pgsqldriver.Config{Schema: schema, ListenConnConfig: direct})
	if err != nil {
		t.Fatal(err)
	}
	wake, err := listening.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatalf("ListenOutbox on a direct ListenConnConfig: %v", err)
	}
	select { // the signal of the first connection
	case <-wake:
	case <-time.After(5 * time.Second):
	}
	e, err := event.New("Test.Happened.v1", "k", map[string]int{"seq": 1})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := drv.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Error("an enqueue through PgBouncer did not wake the listener on the direct connection")
	}
}
