package testdb

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
)

// describeSchemaSQL lists what a schema holds ($1), each line with the
// schema's name written as it is: relations and their kind, options and
// partition bounds, columns, constraints, indexes, functions, triggers
// (but the foreign keys' internal ones, named by OID), sequences and
// comments.
const describeSchemaSQL = `
SELECT 'rel ' || c.relname || ' ' || c.relkind::text || ' ' || c.relpersistence::text || ' ' || coalesce(c.reloptions::text, '') || ' ' || coalesce(pg_get_expr(c.relpartbound, c.oid), '') || ' ' || coalesce(pg_get_partkeydef(c.oid), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
UNION ALL
SELECT 'col ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' ' || a.attidentity::text || ' ' || a.attgenerated::text || ' ' || a.attnum::text || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' ' || coalesce(a.attcompression::text, '') || ' ' || a.attstorage::text
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = $1 AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'con ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(o.oid)
FROM pg_constraint o JOIN pg_namespace n ON n.oid = o.connamespace WHERE n.nspname = $1
UNION ALL
SELECT 'idx ' || pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
UNION ALL
SELECT 'fn ' || pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
UNION ALL
SELECT 'trg ' || pg_get_triggerdef(g.oid)
FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND NOT g.tgisinternal
UNION ALL
SELECT 'seq ' || s.sequencename || ' ' || s.data_type || ' ' || s.start_value || ' ' || s.increment_by || ' ' || coalesce(s.last_value, 0)
FROM pg_sequences s WHERE s.schemaname = $1
UNION ALL
SELECT 'comment ' || c.relname || ' ' || d.objsubid::text || ' ' || d.description
FROM pg_description d JOIN pg_class c ON c.oid = d.objoid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
ORDER BY 1`

// describeSchema returns describeSchemaSQL's lines for schema, with the
// schema's name replaced by SCHEMA, and the rows of its idem_migration.
func describeSchema(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, describeSchemaSQL, schema)
	if err != nil {
		t.Fatalf("describe %s: %v", schema, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("describe %s: %v", schema, err)
	}
	rows, err = pool.Query(ctx, `SELECT version || ' ' || name || ' ' || coalesce(compatible_from::text, 'null') || ' ' || (applied_at <= now())
		FROM `+pgx.Identifier{schema, "idem_migration"}.Sanitize()+` ORDER BY version`)
	if err != nil {
		t.Fatalf("idem_migration of %s: %v", schema, err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("idem_migration of %s: %v", schema, err)
	}
	if len(applied) == 0 {
		t.Fatalf("%s: idem_migration is empty", schema)
	}
	out := strings.Join(lines, "\n") + "\nmigrations:\n" + strings.Join(applied, "\n")
	return strings.ReplaceAll(out, schema, "SCHEMA")
}

// MigrationScript, which most tests get their database from (Postgres,
// PostgresSQL), leaves the schema Migrate leaves: the same relations,
// columns, constraints, indexes, functions, triggers and recorded
// migrations; and both drivers find it up to date.
func TestMigrationScriptIsMigrate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	pool1, s1 := Schema(t, 2)
	byMigrate, err := pgdriver.New(pool1, &pgdriver.Config{Schema: s1})
	if err != nil {
		t.Fatal(err)
	}
	if err := byMigrate.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	want := describeSchema(t, pool1, s1)
	if !strings.Contains(want, "fn ") || !strings.Contains(want, "idx ") {
		t.Fatalf("the description of a migrated schema lacks functions or indexes:\n%s", want)
	}

	pool2, s2 := Schema(t, 2)
	drv2, err := pgdriver.New(pool2, &pgdriver.Config{Schema: s2})
	if err != nil {
		t.Fatal(err)
	}
	ApplyMigrations(t, drv2, func(ctx context.Context, script string) error {
		_, err := pool2.Exec(ctx, script)
		return err
	})
	if got := describeSchema(t, pool2, s2); got != want {
		t.Errorf("MigrationScript (pgdriver) left another schema than Migrate:\n--- Migrate\n%s\n--- MigrationScript\n%s", want, got)
	}
	if err := drv2.Validate(ctx); err != nil {
		t.Errorf("pgdriver Validate after MigrationScript: %v", err)
	}
	applied, err := drv2.MigrateApplied(ctx)
	if err != nil || len(applied) != 0 {
		t.Errorf("pgdriver MigrateApplied after MigrationScript = %v, %v; want nothing to apply", applied, err)
	}

	sqlDrv, s3 := PostgresSQLSchema(t)
	if got := describeSchema(t, Pool(t, s3, 2), s3); got != want {
		t.Errorf("PostgresSQL's MigrationScript (pgsqldriver) left another schema than Migrate:\n--- Migrate\n%s\n--- MigrationScript\n%s", want, got)
	}
	if err := sqlDrv.Validate(ctx); err != nil {
		t.Errorf("pgsqldriver Validate after MigrationScript: %v", err)
	}
	sqlApplied, err := sqlDrv.MigrateApplied(ctx)
	if err != nil || len(sqlApplied) != 0 {
		t.Errorf("pgsqldriver MigrateApplied after MigrationScript = %v, %v; want nothing to apply", sqlApplied, err)
	}
}
