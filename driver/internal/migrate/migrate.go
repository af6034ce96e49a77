// Package migrate is what idem's backends share to apply their migrations.
package migrate

import (
	"context"
	"fmt"
	"time"

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

// Run is a backend's MigrateApplied. It reads the status first: a database
// with migrations this binary does not know (a newer binary migrated it) is
// refused, unless they are all recorded as accepting this binary and
// nothing is pending (then it is left alone, see
// MigrationStatus.NewerAccepted), and one with nothing pending is left
// alone, without DDL, so that
// a role without CREATE rights can run on a database migrated by another.
// The pending migrations are applied by Each, and the status read again
// after: versions a newer binary applied while this one waited for the
// migration lock are refused as above. A run that fails because
// again(err) (a lock not available in time, a busy database), in reading
// the status or in applying, is tried again from the status, up to 5 times,
// 1 to 8 s apart.
func Run[TTx any](ctx context.Context, name string, b driver.Backend[TTx], ms []driver.Migration,
	status func(context.Context) (driver.MigrationStatus, error),
	apply func(ctx context.Context, tx TTx, ms []driver.Migration) ([]driver.Migration, error),
	again func(error) bool) ([]driver.Migration, error) {
	var done []driver.Migration
	wait := time.Second
	for attempt := 1; ; attempt++ {
		st, err := status(ctx)
		if err == nil {
			if len(st.Unknown()) > 0 {
				if err := st.Err(); err != nil {
					return done, fmt.Errorf("%s: migrate: %w", name, err)
				}
				return done, nil
			}
			if st.UpToDate() {
				return done, nil
			}
			var n []driver.Migration
			n, err = Each(ctx, b, ms, apply)
			done = append(done, n...)
			if err == nil {
				// A newer binary may have migrated while this one
				// waited for the migration lock: what it applied is
				// judged as if it had migrated first.
				if st, err = status(ctx); err == nil && len(st.Unknown()) > 0 {
					if err := st.Err(); err != nil {
						return done, fmt.Errorf("%s: migrate: %w", name, err)
					}
				}
			}
		}
		if err == nil || attempt == 5 || !again(err) {
			return done, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return done, err
		case <-t.C:
		}
		wait *= 2
	}
}

// RefuseNewer returns an error when applied holds a version ms does not
// know (a newer binary migrated the database), unless every such version
// is recorded as accepting this binary and none of ms was applied now (in
// the caller's transaction, under the newer schema).
func RefuseNewer(name string, ms []driver.Migration, applied []driver.AppliedMigration, now []driver.Migration) error {
	st := driver.NewMigrationStatus(ms, applied)
	if len(st.Unknown()) == 0 {
		return nil
	}
	st.Pending = now
	if err := st.Err(); err != nil {
		return fmt.Errorf("%s: migrate: %w", name, err)
	}
	return nil
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
