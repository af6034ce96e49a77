// Package pgstore is the PostgreSQL payments.Store, on pgx v5.
//
// The payment table has the shape rule R-DIST-IDEM-4 asks for: amount numeric(19,4),
// created_at timestamptz, and the constraint
// payment_provider_external_id_key UNIQUE (payment_provider,
// external_payment_id). Migrate creates it in the connection's search_path
// from migrations embedded in this package and tracked in their own table,
// payment_migration, separate from idem's.
//
// CreateOrGet runs the INSERT in a savepoint of the caller's transaction
// (uniq.CreateOrGetTx), so a duplicate rolls back only the INSERT and the
// existing payment is then read in the same, still usable, transaction.
package pgstore
