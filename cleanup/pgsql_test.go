package cleanup_test

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

// pgsqlReplica opens a second database/sql pool on drv's schema, as a
// second process would.
func pgsqlReplica(t *testing.T, drv driver.Driver[*sql.Tx]) driver.Driver[*sql.Tx] {
	t.Helper()
	var schema string
	if err := drv.(*pgsqldriver.Driver).DB().QueryRowContext(t.Context(), "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatalf("current_schema: %v", err)
	}
	r, err := pgsqldriver.New(testdb.SQLPool(t, schema, 10), &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgsqldriver.New: %v", err)
	}
	return r
}
