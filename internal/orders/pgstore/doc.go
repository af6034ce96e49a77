// Package pgstore is the PostgreSQL orders.Store, on pgx v5.
//
// customer_order holds the orders (amount numeric(19,4), items jsonb,
// created_at timestamptz) and customer_order_summary the projection (one
// row per customer, total_amount numeric(30,4)), which ApplyCreated
// upserts with INSERT ... ON CONFLICT DO UPDATE, so concurrent consumers
// (replicas) never lose an update. Migrate creates them in the
// connection's search_path from migrations embedded in this package and
// tracked in their own table, order_migration.
package pgstore
