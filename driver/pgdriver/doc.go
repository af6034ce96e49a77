// Package pgdriver is idem's PostgreSQL backend, built on pgx v5.
//
//	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/app")
//	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: "idem"})
//	err = drv.Migrate(ctx)
//
// The transaction type is pgx.Tx: idem's statements that must be atomic with
// a business write run in the caller's pgx.Tx (see driver.Driver).
//
// Tables live in Config.Schema (created by Migrate when missing) and carry
// Config.TablePrefix, so idem can share an existing application database.
// Migrations are embedded, numbered SQL files; Migrate serialises concurrent
// migrators (several replicas starting at once) with a transaction-scoped
// advisory lock.
package pgdriver
