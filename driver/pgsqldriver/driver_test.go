package pgsqldriver_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

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

// As pgdriver: with a default isolation level other than READ COMMITTED,
// Validate, the record claim and the relay's claim refuse to run.
func TestIsolationLevelChecked(t *testing.T) {
	t.Parallel()
	db, schema := testdb.SQLDB(t, 1) // one connection: SET applies to every use
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	drivertest.IsolationChecked[*sql.Tx](t, drv, func(ctx context.Context, sql string) error {
		_, err := db.ExecContext(ctx, sql)
		return err
	})
}

// As pgdriver: a recovery loop's List of unfinished sagas reads the index
// of unfinished sagas, not every finished saga of the retention.
func TestSagaListReadsUnfinishedIndex(t *testing.T) {
	t.Parallel()
	drivertest.SagaListReadsUnfinishedIndex[*sql.Tx](t, testdb.PostgresSQL(t), func(ctx context.Context, tx *sql.Tx, query string, dest ...any) error {
		if len(dest) == 0 {
			_, err := tx.ExecContext(ctx, query)
			return err
		}
		return tx.QueryRowContext(ctx, query).Scan(dest...)
	})
}

// As pgdriver: under a DateStyle other than ISO, a pool whose results are
// text (pgx's stdlib with default_query_exec_mode=exec) cannot read
// timestamps and Validate refuses it; one with binary results works.
func TestDateStyleChecked(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			_, schema := testdb.Schema(t, 1)
			cfg, err := pgx.ParseConfig(testdb.DSN())
			if err != nil {
				t.Fatal(err)
			}
			cfg.RuntimeParams["search_path"] = schema
			cfg.DefaultQueryExecMode = mode
			db := stdlib.OpenDB(*cfg)
			db.SetMaxOpenConns(1) // one connection: SET applies to every use
			t.Cleanup(func() { _ = db.Close() })
			drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			if err := drv.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			drivertest.DateStyleChecked[*sql.Tx](t, drv, mode != pgx.QueryExecModeCacheStatement, func(ctx context.Context, sql string) error {
				_, err := db.ExecContext(ctx, sql)
				return err
			})
		})
	}
}
