package pgstore

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate applies the pending orders migrations in one transaction. An
// advisory lock per schema serialises replicas starting together.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := driver.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idemd-orders-migrate:' || current_schema()))`); err != nil {
			return fmt.Errorf("pgstore: migrate: lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS order_migration (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("pgstore: migrate: %w", err)
		}
		for _, m := range ms {
			var applied bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM order_migration WHERE version = $1)`, m.Version).Scan(&applied); err != nil {
				return fmt.Errorf("pgstore: migrate: %w", err)
			}
			if applied {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("pgstore: migration %03d_%s: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO order_migration (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("pgstore: migrate: %w", err)
			}
		}
		return nil
	})
}
