package pgsqldriver_test

import (
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

// Replicas of both drivers migrating one schema at once (a rollout): the
// migration lock is shared, and every one succeeds, also those naming the
// schema through search_path and one whose sessions default to REPEATABLE
// READ.
func TestConcurrentMigrateMixedDrivers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, schema := testdb.Schema(t, 2)
	rrDB := testdb.SQLPoolParams(t, schema, 2, map[string]string{"default_transaction_isolation": "repeatable read"})
	var migrators []func() error
	for i := range 6 {
		var db *sql.DB
		if i == 5 {
			db = rrDB
		} else {
			db = testdb.SQLPool(t, schema, 2)
		}
		cfg := &pgsqldriver.Config{Schema: schema}
		if i%2 == 1 {
			cfg = &pgsqldriver.Config{} // through search_path
		}
		drv, err := pgsqldriver.New(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		migrators = append(migrators, func() error { return drv.Migrate(ctx) })
	}
	for i := range 2 {
		cfg := &pgdriver.Config{Schema: schema}
		if i == 1 {
			cfg = &pgdriver.Config{}
		}
		drv, err := pgdriver.New(testdb.Pool(t, schema, 2), cfg)
		if err != nil {
			t.Fatal(err)
		}
		migrators = append(migrators, func() error { return drv.Migrate(ctx) })
	}
	errs := make([]error, len(migrators))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, m := range migrators {
		wg.Go(func() {
			<-start
			errs[i] = m()
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: Migrate: %v", i, err)
		}
	}
}

// As pgdriver: the migration job runs as the owner of the schema a DBA
// created for it, which may not create schemas in the database; Migrate
// naming the schema, and MigrationTableSQL with Migrations, migrate it.
func TestMigrateAsSchemaOwner(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, how := range []string{"Migrate", "rendered SQL"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			_, schema := testdb.Schema(t, 1)
			owner := testdb.RoleSQLPool(t, testdb.SchemaOwner(t, schema), schema, 2)
			drv, err := pgsqldriver.New(owner, &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			if how == "Migrate" {
				if err := drv.Migrate(ctx); err != nil {
					t.Fatalf("Migrate as the schema's owner: %v", err)
				}
			} else {
				ms, err := drv.Migrations()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := owner.ExecContext(ctx, drv.MigrationTableSQL()); err != nil {
					t.Fatalf("MigrationTableSQL as the schema's owner: %v", err)
				}
				for _, m := range ms {
					if _, err := owner.ExecContext(ctx, m.SQL); err != nil {
						t.Fatalf("migration %d: %v", m.Version, err)
					}
					if _, err := owner.ExecContext(ctx, `INSERT INTO "`+schema+`".idem_migration (version, name, compatible_from) VALUES ($1, $2, $3)`,
						m.Version, m.Name, m.CompatibleFrom); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := drv.Validate(ctx); err != nil {
				t.Errorf("Validate after migrating as the schema's owner: %v", err)
			}
		})
	}
}

// As pgdriver: a database a newer binary migrated, read through
// database/sql.
func TestNewerSchema(t *testing.T) {
	t.Parallel()
	drivertest.NewerSchema(t, drivertest.MigrationTable[*sql.Tx]{
		New: func(t *testing.T) (drivertest.Migrator[*sql.Tx], func(string) error) {
			db, schema := testdb.SQLDB(t, 4)
			drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return drv, func(q string) error {
				_, err := db.ExecContext(t.Context(), strings.ReplaceAll(q, "{{table}}", drv.Table("idem_migration")))
				return err
			}
		},
		CreateOld: `CREATE TABLE {{table}} (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`,
		InsertOld: `INSERT INTO {{table}} (version, name) VALUES ({{version}}, '{{name}}')`,
		Insert:    `INSERT INTO {{table}} (version, name, compatible_from) VALUES ({{version}}, '{{name}}', {{from}})`,
	})
}

// As pgdriver: CheckPrivileges names the tables a later migration created
// without a grant for the service's role, and the GRANT that fixes it.
func TestCheckPrivileges(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 2)
	owner, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	testdb.DMLPool(t, pool, schema)
	role := schema + "_dml"
	app := testdb.RoleSQLPool(t, role, schema, 2)
	drv, err := pgsqldriver.New(app, &pgsqldriver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.CheckPrivileges(ctx); err != nil {
		t.Errorf("CheckPrivileges with every privilege: %v", err)
	}
	if _, err := pool.Exec(ctx, `REVOKE ALL ON outbox_pending FROM `+role+`; REVOKE SELECT ON idem_migration FROM `+role); err != nil {
		t.Fatal(err)
	}
	err = drv.CheckPrivileges(ctx)
	if err == nil || !strings.Contains(err.Error(), `outbox_pending (SELECT, INSERT, UPDATE, DELETE)`) ||
		!strings.Contains(err.Error(), `idem_migration (SELECT)`) ||
		!strings.Contains(err.Error(), `GRANT SELECT ON idem_migration TO "`+role+`"; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_pending TO "`+role+`"`) {
		t.Fatalf("CheckPrivileges without privileges on outbox_pending and idem_migration: %v", err)
	}
}

// As pgdriver: a service whose role may read and write idem's tables but
// not create anything starts: Migrate and MigrateTx on an up-to-date
// schema run no DDL.
func TestMigrateUpToDateWithoutCreatePrivilege(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 2)
	owner, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	testdb.DMLPool(t, pool, schema)
	app := testdb.RoleSQLPool(t, schema+"_dml", schema, 2)
	for _, c := range []*pgsqldriver.Config{{Schema: schema}, {}} {
		drv, err := pgsqldriver.New(app, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.Migrate(ctx); err != nil {
			t.Errorf("Migrate (Schema %q) without CREATE rights on an up-to-date schema: %v", c.Schema, err)
		}
		tx, err := app.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.MigrateTx(ctx, tx); err != nil {
			t.Errorf("MigrateTx (Schema %q) without CREATE rights on an up-to-date schema: %v", c.Schema, err)
		}
		_ = tx.Rollback()
	}
}

// As pgdriver: Migrate's error says that migrations are pending and this
// role may not run them.
func TestMigratePendingWithoutCreatePrivilege(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, schema := testdb.Schema(t, 2)
	testdb.DMLPool(t, testdb.Pool(t, schema, 1), schema)
	drv, err := pgsqldriver.New(testdb.RoleSQLPool(t, schema+"_dml", schema, 2), &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	err = drv.Migrate(ctx)
	if err == nil || !strings.Contains(err.Error(), "permission denied") ||
		!strings.Contains(err.Error(), "migrations are pending and this role may not run them: run them first as the tables' owner") {
		t.Errorf("Migrate without CREATE rights on an empty schema: %v; want permission denied, and what to do", err)
	}
}
