// Package pgstore is the PostgreSQL orders.Store, on pgx v5.
//
// customer_order holds the orders (amount numeric(19,4), items jsonb,
// created_at timestamptz) and customer_order_summary the projection (one
// row per customer, total_amount numeric(30,4)), to which Apply adds
// deltas with INSERT ... ON CONFLICT DO UPDATE, one statement per
// customer in ascending customer_id order, so concurrent consumers
// (replicas) never lose an update and never deadlock. Migrate creates them in the
// connection's search_path from migrations embedded in this package and
// tracked in their own table, order_migration.
package pgstore
