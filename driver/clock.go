package driver

import (
	"context"
	"time"
)

// Clock is implemented by backends that can tell the database's clock
// (pgdriver and pgsqldriver: PostgreSQL's clock_timestamp(); sqlitedriver:
// the host's clock, SQLite running in the process). Replicas of a service
// run on hosts whose clocks may disagree, and the times idem compares
// across them (the lease of an in-progress idempotency record, a record's
// expiry, the cleanup lease and cut-offs) are written by one host and read
// by another; the database's clock is the one they all share. idemhttp
// (ModeLease) and cleanup correct their default clock by it (see their
// Config.Now).
type Clock interface {
	// DatabaseNow returns the database's current time.
	DatabaseNow(ctx context.Context) (time.Time, error)
}
