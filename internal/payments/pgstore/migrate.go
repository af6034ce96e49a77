package pgstore

import (
	"context"
	"embed"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/appmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate applies the pending payment migrations in one transaction,
// recording them in payment_migration. An advisory lock per schema serialises
// replicas starting together.
func (s *Store) Migrate(ctx context.Context) error {
	return appmigrate.Postgres(ctx, s.pool, migrationFS, "migrations", "payment_migration", "idemd-payments-migrate")
}

// MigrationStatus returns which of these migrations the database has
// (recorded in payment_migration).
func (s *Store) MigrationStatus(ctx context.Context) (driver.MigrationStatus, error) {
	return appmigrate.PostgresStatus(ctx, s.pool, migrationFS, "migrations", "payment_migration")
}
