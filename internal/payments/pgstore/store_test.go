package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/payments/pgstore"
	"github.com/idemkit/idem/internal/payments/storetest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness[pgx.Tx] {
		drv := testdb.Postgres(t)
		store := pgstore.New(drv.Pool())
		if err := store.Migrate(context.Background()); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		if err := store.Migrate(context.Background()); err != nil {
			t.Fatalf("migrate again: %v", err)
		}
		return storetest.Harness[pgx.Tx]{
			Store:  store,
			Driver: drv,
			Count: func(ctx context.Context) (n int, err error) {
				err = drv.Pool().QueryRow(ctx, `SELECT count(*) FROM payment`).Scan(&n)
				return n, err
			},
		}
	})
}
