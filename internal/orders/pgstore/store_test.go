package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/orders/pgstore"
	"github.com/idemkit/idem/internal/orders/storetest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness[pgx.Tx] {
		drv := testdb.Postgres(t)
		store := pgstore.New(drv.Pool())
		for range 2 { // migrating again is a no-op
			if err := store.Migrate(context.Background()); err != nil {
				t.Fatalf("migrate: %v", err)
			}
		}
		return storetest.Harness[pgx.Tx]{Store: store, Driver: drv}
	})
}
