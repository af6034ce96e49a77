package testdb

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/driver"
)

// Migrator is what a PostgreSQL driver gives an external migration tool
// (pgdriver's and pgsqldriver's Migrations, MigrationTableSQL and Table).
type Migrator interface {
	Migrations() ([]driver.Migration, error)
	MigrationTableSQL() string
	Table(name string) string
}

// MigrationScript returns what an external migration tool applies to
// migrate drv's database, as one script: the migration table, every
// migration in version order and its record in the migration table (see
// pgdriver.Driver.Migrations). Run as one simple query it is one round
// trip and one transaction, where Migrate takes a transaction per
// migration and a round trip per statement; TestMigrationScriptIsMigrate
// checks that both leave the same schema.
func MigrationScript(drv Migrator) (string, error) {
	ms, err := drv.Migrations()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(drv.MigrationTableSQL())
	for _, m := range ms {
		b.WriteString(m.SQL)
		b.WriteString(";\n")
	}
	fmt.Fprintf(&b, "INSERT INTO %s (version, name, compatible_from) VALUES ", drv.Table("idem_migration"))
	for i, m := range ms {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%d, '%s', %d)", m.Version, strings.ReplaceAll(m.Name, "'", "''"), m.CompatibleFrom)
	}
	b.WriteString(";\n")
	return b.String(), nil
}

// ApplyMigrations migrates drv's fresh database by running its
// MigrationScript with exec, which must send it as one simple query (pgx
// and lib/pq do for a statement without arguments), so that it is one
// implicit transaction. It is how the tests that are not about migrating
// get a migrated database cheaply; the tests of Migrate call Migrate.
func ApplyMigrations(t testing.TB, drv Migrator, exec func(ctx context.Context, script string) error) {
	t.Helper()
	script, err := MigrationScript(drv)
	if err != nil {
		t.Fatalf("migrations: %v", err)
	}
	if err := exec(context.Background(), script); err != nil {
		t.Fatalf("migrate: %v", err)
	}
}
