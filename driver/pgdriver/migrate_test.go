package pgdriver_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

func TestMigrationsRendered(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 4)
	drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema, TablePrefix: "x_"})
	ms, err := drv.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 {
		t.Fatal("no migrations")
	}
	for _, m := range ms {
		if strings.Contains(m.SQL, "{{") {
			t.Errorf("migration %d not rendered:\n%s", m.Version, m.SQL)
		}
	}
	if s := drv.MigrationTableSQL(); strings.Contains(s, "{{") || !strings.Contains(s, `"`+schema+`".x_idem_migration`) {
		t.Errorf("MigrationTableSQL = %s", s)
	}
}

// columns describes the columns of the tables in schema.
func columns(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT table_name, column_name, data_type, is_nullable,
		coalesce(column_default, '') FROM information_schema.columns WHERE table_schema = $1
		ORDER BY table_name, column_name`, schema)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var tn, cn, dt, null, def string
		if err := rows.Scan(&tn, &cn, &dt, &null, &def); err != nil {
			t.Fatal(err)
		}
		b.WriteString(strings.Join([]string{tn, cn, dt, null, strings.ReplaceAll(def, schema, "S")}, " ") + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestMigrationsAppliedByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	poolA, schemaA := testdb.Schema(t, 4)
	poolB, schemaB := testdb.Schema(t, 4)
	byHand := newBareDriver(t, poolA, &pgdriver.Config{Schema: schemaA, TablePrefix: "x_"})
	byIdem := newBareDriver(t, poolB, &pgdriver.Config{Schema: schemaB, TablePrefix: "x_"})

	st, err := byHand.MigrationStatus(ctx)
	if err != nil {
		t.Fatalf("status on an empty schema: %v", err)
	}
	ms, _ := byHand.Migrations()
	if st.UpToDate() || len(st.Pending) != len(ms) || st.Current() != 0 || st.Latest != ms[len(ms)-1].Version {
		t.Fatalf("empty schema status = %+v", st)
	}
	if err := byHand.Validate(ctx); err == nil || !strings.Contains(err.Error(), "pending") {
		t.Fatalf("Validate on an empty schema = %v", err)
	}

	if _, err := poolA.Exec(ctx, byHand.MigrationTableSQL()); err != nil {
		t.Fatalf("migration table: %v", err)
	}
	for _, m := range ms {
		tx, err := poolA.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+byHand.Table("idem_migration")+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := byIdem.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*pgdriver.Driver{byHand, byIdem} {
		st, err := d.MigrationStatus(ctx)
		if err != nil || !st.UpToDate() || st.Current() != st.Latest {
			t.Fatalf("status after migrating = %+v, %v", st, err)
		}
		if err := d.Validate(ctx); err != nil {
			t.Fatalf("Validate: %v", err)
		}
	}
	if a, b := columns(t, poolA, schemaA), columns(t, poolB, schemaB); a != b || a == "" {
		t.Fatalf("columns differ:\nby hand:\n%s\nby Migrate:\n%s", a, b)
	}
	// Migrate over the hand-applied schema is a no-op.
	if done, err := byHand.MigrateApplied(ctx); err != nil || len(done) != 0 {
		t.Fatalf("MigrateApplied after hand = %v, %v", done, err)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Schema(t, 4)
	drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema})
	done, err := drv.MigrateApplied(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := drv.Migrations()
	if len(done) != len(ms) {
		t.Fatalf("applied %d of %d", len(done), len(ms))
	}
	last := ms[len(ms)-1]
	if _, err := pool.Exec(ctx, `DELETE FROM `+drv.Table("idem_migration")+` WHERE version = $1`, last.Version); err != nil {
		t.Fatal(err)
	}
	err = drv.Validate(ctx)
	if err == nil || !strings.Contains(err.Error(), "pending migrations "+strconv.Itoa(last.Version)) {
		t.Fatalf("Validate with one pending = %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+drv.Table("idem_migration")+` (version, name) VALUES ($1, 'x'), (999, 'future')`, last.Version); err != nil {
		t.Fatal(err)
	}
	err = drv.Validate(ctx)
	if err == nil || !strings.Contains(err.Error(), "database schema is newer than this binary: version 999") {
		t.Fatalf("Validate with a newer version = %v", err)
	}
}

func newBareDriver(t *testing.T, pool *pgxpool.Pool, cfg *pgdriver.Config) *pgdriver.Driver {
	t.Helper()
	drv, err := pgdriver.New(pool, cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return drv
}

// A database a newer binary migrated: accepted when its newer versions
// record that they accept this binary, refused otherwise; and the upgrade
// from a migration table created before compatible_from.
func TestNewerSchema(t *testing.T) {
	t.Parallel()
	drivertest.NewerSchema(t, drivertest.MigrationTable[pgx.Tx]{
		New: func(t *testing.T) (drivertest.Migrator[pgx.Tx], func(string) error) {
			pool, schema := testdb.Schema(t, 4)
			drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema, TablePrefix: "x_"})
			return drv, func(q string) error {
				_, err := pool.Exec(t.Context(), strings.ReplaceAll(q, "{{table}}", drv.Table("idem_migration")), pgx.QueryExecModeSimpleProtocol)
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

// A migrator that read a pending migration, then waited for the migration
// lock while a newer binary applied it and a version of its own that
// refuses older binaries, finds the newer version once it holds the lock:
// Migrate refuses it, as it refuses it when the newer binary migrated
// first. Before, it skipped the migration it had read as pending and
// returned nil, so `idemd migrate up` exited 0 on a schema its binary may
// not run on.
func TestMigrateRefusesNewerAppliedWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 4)
	drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema})

	// The newer binary: every migration, and version 999 refusing older
	// binaries, in a transaction that holds the migration lock.
	newer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = newer.Rollback(context.Background()) }()
	if err := drv.MigrateTx(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if _, err := newer.Exec(ctx, `INSERT INTO `+drv.Table("idem_migration")+` (version, name, compatible_from) VALUES (999, 'from_a_newer_binary', 999)`); err != nil {
		t.Fatal(err)
	}
	var holder int
	if err := newer.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
		t.Fatal(err)
	}

	migrated := make(chan error, 1)
	go func() { migrated <- drv.Migrate(ctx) }()
	testdb.WaitForAdvisoryWaiter(ctx, t, pool, holder, migrated, "Migrate")
	if err := newer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-migrated:
		if err == nil || !strings.Contains(err.Error(), "database schema is newer than this binary: version 999") {
			t.Fatalf("Migrate after a newer binary applied a refusing version = %v, want it refused", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Migrate did not return after the lock was released")
	}
	if err := drv.Validate(ctx); err == nil {
		t.Fatal("Validate accepts the schema")
	}
}
