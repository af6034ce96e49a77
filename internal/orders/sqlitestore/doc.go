// Package sqlitestore is the SQLite orders.Store, on database/sql with
// modernc.org/sqlite (share driver/sqlitedriver's *sql.DB, so the store
// writes in the transactions of the idemhttp middleware and of the inbox).
//
// The tables mirror the PostgreSQL ones within SQLite's types: amounts are
// exact decimal TEXT with 4 fractional digits ("19.9000"), never REAL,
// enforced by STRICT tables and CHECKs, so Apply adds them in Go with
// shopspring/decimal inside the inbox's write transaction (BEGIN
// IMMEDIATE: no concurrent writer); items is JSON TEXT; times are RFC 3339
// TEXT in UTC with microseconds. An order's amount is positive, as
// PostgreSQL's CHECK (amount > 0) requires, enforced by triggers on INSERT
// and UPDATE (migration 005: SQLite cannot add a CHECK to an existing
// table). Migrations are embedded and tracked in their own table,
// order_migration.
package sqlitestore
