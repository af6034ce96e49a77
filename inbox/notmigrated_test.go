package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
)

// TestNotMigrated: on a database where Migrate has not run, Process fails
// with driver.ErrNotMigrated, in an error naming the inbox's table and the
// fix, and the handler's effect is not committed.
func TestNotMigrated(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pool, schema := testdb.Schema(t, 4)
		testNotMigrated[pgx.Tx](t, pgDriver(t, pool, schema))
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
	ib, err := inbox.New(drv, &inbox.Config{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := ib.Process(t.Context(), uuid.New(), func(context.Context, TTx) error { return nil })
	if applied || !errors.Is(err, driver.ErrNotMigrated) {
		t.Fatalf("Process = %v, %v; want driver.ErrNotMigrated", applied, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "processed_event") || !strings.Contains(msg, "run the driver's Migrate") {
		t.Errorf("Process: %q; want it to name the table and Migrate", msg)
	}
	_, err = ib.ProcessBatch(t.Context(), []inbox.Event{{ID: uuid.New()}}, func(context.Context, TTx, inbox.Event) error { return nil })
	if !errors.Is(err, driver.ErrNotMigrated) {
		t.Errorf("ProcessBatch: %v; want driver.ErrNotMigrated", err)
	}
}
