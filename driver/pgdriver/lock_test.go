package pgdriver_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// openReplica opens a second pool on drv's schema, as a second process
// would.
func openReplica(t *testing.T, drv driver.Driver[pgx.Tx]) driver.Driver[pgx.Tx] {
	t.Helper()
	schema := drv.(*pgdriver.Driver).Pool().Config().ConnConfig.RuntimeParams["search_path"]
	r, err := pgdriver.New(testdb.Pool(t, schema, 10), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgdriver.New: %v", err)
	}
	return r
}
