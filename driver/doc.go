// Package driver is the storage interface that every idem backend implements.
//
// The interface is owned by idem and is UNSTABLE: it may change between minor
// versions. Application code should not call it directly; use the
// higher-level packages (idemhttp, inbox, outbox, cleanup, saga) and open a
// backend with one of the driver packages:
//
//   - driver/pgdriver: PostgreSQL through pgx v5 (pgxpool.Pool, pgx.Tx)
//   - driver/sqlitedriver: SQLite through modernc.org/sqlite (*sql.DB, *sql.Tx)
//
// A Driver is generic over the transaction type TTx of its database library,
// as river's drivers are: code that must be atomic with a business write takes
// the caller's TTx and turns it into an Executor with UnwrapExecutor, so
// idem's statements run in the caller's transaction and nothing commits behind
// the caller's back.
//
// Every backend must pass the shared suite in driver/drivertest.
package driver
