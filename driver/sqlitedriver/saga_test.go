package sqlitedriver_test

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestSaga(t *testing.T) {
	t.Parallel()
	drivertest.RunSaga(t, func(t *testing.T) driver.Driver[*sql.Tx] {
		return testdb.SQLite(t)
	})
}
