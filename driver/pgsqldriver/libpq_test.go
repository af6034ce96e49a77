package pgsqldriver_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"

	_ "github.com/lib/pq" // registers "postgres"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

// libpqDB opens a database/sql pool through lib/pq on a fresh schema (its
// search_path, passed as a run-time parameter).
func libpqDB(t *testing.T, maxConns int) (*sql.DB, string) {
	t.Helper()
	_, schema := testdb.Schema(t, 1)
	u, err := url.Parse(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	db, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db, schema
}

// The driver conformance suite over lib/pq, the other database/sql driver
// for PostgreSQL in wide use (the rest of this package's tests use pgx's
// stdlib driver).
func TestDriverLibPQ(t *testing.T) {
	t.Parallel()
	open := func(t *testing.T, migrate bool) driver.Driver[*sql.Tx] {
		db, schema := libpqDB(t, 24)
		drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if migrate { // the migration tests call Migrate on an unmigrated one
			testdb.ApplyMigrations(t, drv, func(ctx context.Context, script string) error {
				_, err := db.ExecContext(ctx, script)
				return err
			})
		}
		return drv
	}
	drivertest.Run(t, drivertest.Backend[*sql.Tx]{
		New:           func(t *testing.T) driver.Driver[*sql.Tx] { return open(t, true) },
		NewUnmigrated: func(t *testing.T) driver.Driver[*sql.Tx] { return open(t, false) },
	})
}
