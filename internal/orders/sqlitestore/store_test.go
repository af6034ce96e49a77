package sqlitestore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemkit/idem/internal/orders/sqlitestore"
	"github.com/idemkit/idem/internal/orders/storetest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness[*sql.Tx] {
		drv := testdb.SQLite(t)
		store := sqlitestore.New(drv.DB())
		for range 2 { // migrating again is a no-op
			if err := store.Migrate(context.Background()); err != nil {
				t.Fatalf("migrate: %v", err)
			}
		}
		return storetest.Harness[*sql.Tx]{Store: store, Driver: drv}
	})
}

func TestAmountIsText(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	ctx := context.Background()
	if err := sqlitestore.New(drv.DB()).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	insert := func(amount any) error {
		_, err := drv.DB().ExecContext(ctx, `INSERT INTO customer_order (customer_id, amount, status, items, created_at)
			VALUES (1, ?, 'CREATED', '[]', '2025-01-01T00:00:00.000000Z')`, amount)
		return err
	}
	for _, bad := range []any{19.9, "19.9", "1e3", "-1.0000"} {
		if err := insert(bad); err == nil {
			t.Errorf("amount %#v accepted", bad)
		}
	}
	if err := insert("19.9000"); err != nil {
		t.Errorf("amount 19.9000 rejected: %v", err)
	}
}
