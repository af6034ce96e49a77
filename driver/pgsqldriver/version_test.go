package pgsqldriver_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

// TestServerVersion (pgdriver's, through database/sql): on a server older than PostgreSQL 12 (run the package
// with IDEM_TEST_DATABASE_URL at one: scripts/pgversions.sh 11), Migrate
// and Validate refuse it with a message naming its version and the one
// idem needs, and Migrate creates none of idem's tables; before, Migrate
// failed migration 006 with `syntax error at or near "("`. On 12 and later
// both pass.
func TestServerVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Schema(t, 2)
	db := testdb.SQLPool(t, schema, 2)
	var num int
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil {
		t.Fatal(err)
	}
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	migErr := drv.Migrate(ctx)
	valErr := drv.Validate(ctx)
	if num >= 120000 {
		if migErr != nil || valErr != nil {
			t.Fatalf("server_version_num %d: Migrate: %v, Validate: %v; want nil", num, migErr, valErr)
		}
		return
	}
	for name, err := range map[string]error{"Migrate": migErr, "Validate": valErr} {
		if err == nil || !strings.Contains(err.Error(), "idem needs PostgreSQL 12 or later") ||
			!strings.Contains(err.Error(), "the database server is PostgreSQL 1") {
			t.Errorf("server_version_num %d: %s: %v; want the server's version refused", num, name, err)
		}
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("Migrate on server_version_num %d left %d tables in %s; want none", num, tables, schema)
	}
}
