package pgsqldriver_test

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

func TestDriver(t *testing.T) {
	t.Parallel()
	drivertest.Run(t, drivertest.Backend[*sql.Tx]{
		New: func(t *testing.T) driver.Driver[*sql.Tx] { return testdb.PostgresSQL(t) },
		NewUnmigrated: func(t *testing.T) driver.Driver[*sql.Tx] {
			db, schema := testdb.SQLDB(t, 10)
			drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return drv
		},
	})
}
