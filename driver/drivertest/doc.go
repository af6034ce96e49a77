// Package drivertest is the shared test suite that every idem storage backend
// must pass, in the manner of watermill's pubsub tests and river's
// riverdrivertest. It has one entry point; a backend is done when
//
//	func TestSuite(t *testing.T) {
//		drivertest.Run(t, drivertest.Backend[pgx.Tx]{
//			New:           newMigratedDriver,   // a fresh, migrated database
//			NewUnmigrated: newUnmigratedDriver, // a fresh, empty database
//		})
//	}
//
// is green under the race detector. Only the backend's Caps (concurrent
// writers) and the optional interfaces it does not implement
// (driver.TxClaimer, driver.EndedRollbacker) make subtests skip. A backend
// whose driver serialises its own callers (a single connection, as
// SQLite's) also sets Backend.Reopen, so that the concurrency subtests race
// several drivers on one database, as several processes would.
//
// Run checks the record semantics idem's HTTP middleware relies on (claim,
// replay of the stored response byte for byte, fingerprint mismatch, lease
// ownership, takeover of abandoned claims, expiry, cleanup in batches, scope
// isolation), each one three times: through Driver.Executor, inside a
// transaction that commits (what the transaction saw is exactly what others
// see afterwards) and inside a transaction that rolls back (nothing remains).
// It also checks that concurrent duplicates produce exactly one claim and, on
// backends whose Caps report ConcurrentWriters, how a claim waits for a
// concurrent uncommitted claim of the same key and how LockTimeout bounds
// that wait. A statement of a transaction cancelled by its own context must
// leave the transaction all or nothing. A backend that implements the optional driver.TxClaimer (the
// one-round-trip ModeTx path) has it checked too: the lock, the read, the
// single completed write, a conflicting record rolling everything back, the
// replacement of an expired record, and a second claim refused or waiting
// for the first to commit; without it that subtest is skipped, and idemhttp
// takes the generic path on the methods above.
//
// Run also checks the inbox, the outbox and its relay, leases, saga
// storage, the retention deletes of the four tables in batches that each
// resume after the key of the batch before (driver.DeleteResult: every
// eligible row deleted once, in the cursor's order, across rows that share
// their time value), and Migrate and MigrateTx on a database that has never
// been migrated.
//
// Every subtest calls t.Parallel and builds its own driver, so the factory
// must return an isolated database (a fresh PostgreSQL schema, a fresh SQLite
// file) each time it is called.
package drivertest
