package pgdriver_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestSaga(t *testing.T) {
	t.Parallel()
	drivertest.RunSaga(t, func(t *testing.T) driver.Driver[pgx.Tx] {
		return testdb.Postgres(t)
	})
}
