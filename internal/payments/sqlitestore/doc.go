// Package sqlitestore is the SQLite payments.Store, on database/sql with
// modernc.org/sqlite (open the database with driver/sqlitedriver and share
// its *sql.DB, so the store writes in the idemhttp middleware's
// transaction).
//
// The payment table mirrors the PostgreSQL one within SQLite's types: id
// INTEGER PRIMARY KEY AUTOINCREMENT (ids are never reused, even after the
// last row is deleted); amount is exact decimal TEXT with 4 fractional
// digits ("100.5000"), never REAL, enforced by a STRICT table and a CHECK,
// and positive like PostgreSQL's CHECK (amount > 0), enforced by triggers
// on INSERT and UPDATE (migration 002: SQLite cannot add a CHECK to an
// existing table); created_at is RFC 3339 TEXT in UTC with microseconds, which sorts
// chronologically; and the constraint payment_provider_external_id_key
// UNIQUE (payment_provider, external_payment_id). Migrations are embedded and
// tracked in their own table, payment_migration, separate from idem's.
//
// SQLite rolls back only the failing statement on a unique violation, so
// CreateOrGet needs no savepoint.
package sqlitestore
