package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// TestNotMigrated: on a database where Migrate has not run, EnqueueTx and
// the relay fail with driver.ErrNotMigrated, and the relay's log says what
// to do (run Migrate), not only that a relation does not exist.
func TestNotMigrated(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pool, schema := testdb.Schema(t, 4)
		drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		testNotMigrated[pgx.Tx](t, drv)
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		drv, err := sqlitedriver.Open(testdb.SQLitePath(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = drv.Close() })
		testNotMigrated[*sql.Tx](t, drv)
	})
}

func testNotMigrated[TTx any](t *testing.T, drv driver.Driver[TTx]) {
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = outbox.EnqueueTx(ctx, drv, tx, mustEvent(t, "k"))
	_ = drv.Rollback(ctx, tx)
	if !errors.Is(err, driver.ErrNotMigrated) {
		t.Errorf("EnqueueTx: %v; want driver.ErrNotMigrated", err)
	}

	var logs testlog.Buffer
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.RunOnce(ctx); !errors.Is(err, driver.ErrNotMigrated) {
		t.Errorf("RunOnce: %v; want driver.ErrNotMigrated", err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "run the driver's Migrate") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if log := logs.String(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "run the driver's Migrate") {
		t.Errorf("the relay's log does not say to run Migrate:\n%s", log)
	}
}
