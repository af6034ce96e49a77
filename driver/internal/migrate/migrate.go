// Package migrate is what idem's backends share to apply their migrations.
package migrate

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/driver"
)

// Each applies ms in order, each in a transaction of its own begun on b,
// through apply (which skips the migrations the database already has and
// returns the ones it applied), and returns every migration it applied,
// also on error. The errors of b's Begin and Commit, which name the
// backend, are returned with the migration's version.
func Each[TTx any](ctx context.Context, b driver.Backend[TTx], ms []driver.Migration,
	apply func(ctx context.Context, tx TTx, ms []driver.Migration) ([]driver.Migration, error)) ([]driver.Migration, error) {
	var done []driver.Migration
	for _, m := range ms {
		tx, err := b.Begin(ctx)
		if err != nil {
			return done, fmt.Errorf("migration %d: %w", m.Version, err)
		}
		n, err := apply(ctx, tx, []driver.Migration{m})
		if err != nil {
			_ = b.Rollback(context.WithoutCancel(ctx), tx)
			return done, err
		}
		if err := b.Commit(ctx, tx); err != nil {
			return done, fmt.Errorf("migration %d: %w", m.Version, err)
		}
		done = append(done, n...)
	}
	return done, nil
}

// Validate is a backend's Validate: nil when status (read with err) says
// the database has exactly the binary's migrations, else the error, the
// status's prefixed with name.
func Validate(name string, status driver.MigrationStatus, err error) error {
	if err != nil {
		return err
	}
	if err := status.Err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
