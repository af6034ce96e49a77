package sqlitedriver_test

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
)

// openReplica opens drv's database file a second time, as a second process
// would.
func openReplica(t *testing.T, drv driver.Driver[*sql.Tx]) driver.Driver[*sql.Tx] {
	t.Helper()
	var seq int
	var name, file string
	if err := drv.(*sqlitedriver.Driver).DB().QueryRowContext(t.Context(), "PRAGMA database_list").Scan(&seq, &name, &file); err != nil {
		t.Fatalf("PRAGMA database_list: %v", err)
	}
	r, err := sqlitedriver.Open(file, nil)
	if err != nil {
		t.Fatalf("sqlitedriver.Open(%s): %v", file, err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}
