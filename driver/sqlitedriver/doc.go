// Package sqlitedriver is idem's SQLite backend, built on modernc.org/sqlite
// (pure Go, no cgo).
//
//	drv, err := sqlitedriver.Open("app.db", nil)
//	err = drv.Migrate(ctx)
//	db := drv.DB() // the application's own queries use the same *sql.DB
//
// Open configures the database the way idem's guarantees need it: WAL
// journal, synchronous=FULL (a committed transaction survives power loss),
// a busy timeout for other processes on the same file, foreign keys on,
// write transactions started with BEGIN IMMEDIATE, and a single connection,
// so that writers in this process are serialised instead of failing with
// SQLITE_BUSY. The consequence: a handler that holds a transaction must do
// all its database work through that transaction (opening a second one from
// the same *sql.DB waits for the first and deadlocks).
//
// The transaction type is *sql.Tx. Times are stored as Unix microseconds.
package sqlitedriver
