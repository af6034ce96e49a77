package sqlitestore

import (
	"context"
	"embed"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/appmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate applies the pending payment migrations in one transaction (BEGIN
// IMMEDIATE with a database opened by sqlitedriver, which serialises
// concurrent migrators), recording them in payment_migration.
func (s *Store) Migrate(ctx context.Context) error {
	return appmigrate.SQLite(ctx, s.db, migrationFS, "migrations", "payment_migration")
}

// MigrationStatus returns which of these migrations the database has
// (recorded in payment_migration).
func (s *Store) MigrationStatus(ctx context.Context) (driver.MigrationStatus, error) {
	return appmigrate.SQLiteStatus(ctx, s.db, migrationFS, "migrations", "payment_migration")
}
