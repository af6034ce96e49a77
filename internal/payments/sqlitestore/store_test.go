package sqlitestore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemkit/idem/internal/payments/sqlitestore"
	"github.com/idemkit/idem/internal/payments/storetest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness[*sql.Tx] {
		drv := testdb.SQLite(t)
		store := sqlitestore.New(drv.DB())
		if err := store.Migrate(context.Background()); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		if err := store.Migrate(context.Background()); err != nil {
			t.Fatalf("migrate again: %v", err)
		}
		return storetest.Harness[*sql.Tx]{
			Store:  store,
			Driver: drv,
			Count: func(ctx context.Context) (n int, err error) {
				err = drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM payment`).Scan(&n)
				return n, err
			},
		}
	})
}

// The amount column never holds a REAL, whatever a buggy caller binds.
func TestAmountIsText(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	ctx := context.Background()
	if err := sqlitestore.New(drv.DB()).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	insert := func(amount any) error {
		_, err := drv.DB().ExecContext(ctx, `INSERT INTO payment
			(payment_provider, external_payment_id, amount, status, customer_id, created_at)
			VALUES ('p', ?, ?, 'PENDING', 1, '2025-01-01T00:00:00.000000Z')`, amount, amount)
		return err
	}
	for _, bad := range []any{100.5, "100.5", "1e3", "-1.0000", "abc.0000"} {
		if err := insert(bad); err == nil {
			t.Errorf("amount %#v accepted", bad)
		}
	}
	if err := insert("100.5000"); err != nil {
		t.Errorf("amount 100.5000 rejected: %v", err)
	}
}
