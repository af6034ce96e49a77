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
//
// # Older and newer binaries on one schema
//
// Each migration declares whether binaries that predate it may run against
// a schema that has it (driver.Migration's CompatibleFrom: "-- older
// binaries: accept", "refuse" or "accept from N" in its file), and Migrate
// records that with its version in idem_migration (column compatible_from).
// A binary that finds versions it does not know (a newer release migrated
// the database: the first replica of a rolling deploy, or a rollback of the
// binary) reads it there: Validate, Migrate and MigrateTx accept the
// schema when every such version accepts this binary and nothing this
// binary knows is missing (MigrationStatus.NewerAccepted reports it, for a
// warning; idemd logs one), and refuse it otherwise, naming the versions
// and the oldest binary the schema needs. A version recorded without
// compatible_from (by idem before it recorded one, or by a tool that did
// not set it) refuses. A migration table created before compatible_from
// gets the column from the first Migrate that applies a migration; until
// then it is read as recording none.
//
// idem's transactions must run at READ COMMITTED, PostgreSQL's default: a
// claim takes the key's lock and then reads the record with a statement
// of its own, whose snapshot, at READ COMMITTED only, follows the lock and
// so sees what the lock's previous holder committed. Validate checks the
// sessions' default_transaction_isolation at start-up (idemd runs it after
// Migrate), and the record claim and the relay's claim refuse another
// level with an error that says what to change.
//
// # Behind a connection pooler
//
// A pooler in transaction mode (PgBouncer with pool_mode = transaction,
// and the poolers that work like it) gives a client a server connection
// for one transaction, or for one statement outside a transaction, so
// nothing a session holds outlives it. idem's statements run in
// transactions, with two exceptions that the driver handles:
//
//   - The uncontended claim of idemhttp's ModeTx takes the key's
//     session-level advisory lock outside a transaction and releases it
//     after the COMMIT. Through such a pooler the lock would be taken in
//     one server session and its release sent to another: the lock would
//     stay with a server connection that the pooler hands to other
//     clients, so the key's retries would be answered 409 in progress, and
//     concurrent duplicates would no longer wait for each other. The driver
//     detects the pooler in Validate or at its first claim (the server
//     process running the statement is not the one the connection was
//     given at its start, as every pooler that can cancel a query must
//     arrange; TransactionPooling reports it), or is told by
//     Config.TransactionPooling, and then takes the lock inside the claim's
//     transaction (pg_try_advisory_xact_lock, with BEGIN and the read of
//     the record in one round trip). A replay that the middleware's cache
//     does not hold then costs a second round trip, its ROLLBACK.
//   - The relay's wake-ups (ListenOutbox): such a pooler passes a
//     notification to a client only while the client runs a transaction.
//     Set Config.ListenConnConfig to a direct connection to PostgreSQL;
//     without it ListenOutbox returns an error wrapping
//     errors.ErrUnsupported, and outbox.Relay polls instead
//     (RelayConfig.PollInterval). Credentials that rotate go in
//     Config.ListenBeforeConnect: ListenConnConfig is used as given at
//     every reconnection.
//
// Two settings are the pool's. PgBouncer before 1.21 does not keep a
// prepared statement from one transaction to the next: connect with
// default_query_exec_mode=cache_describe (or exec) in the URL; later
// versions with max_prepared_statements above 0 keep pgx's default. With
// exec (or simple_protocol) the results come as text, which pgx reads only
// in PostgreSQL's default DateStyle, ISO: where a role or database sets
// another (ALTER ROLE ... SET DateStyle = 'SQL, DMY'), add datestyle=ISO
// to the URL (PgBouncer passes it on) or every read of a record fails;
// Validate refuses such a pool. And PgBouncer does not pass a search_path
// given at connection start on: name idem's schema in Config.Schema. The driver's whole shared test suite
// and idemhttp's concurrent duplicates and retries run through PgBouncer
// in transaction mode in CI.
//
// # The outbox tables
//
// An event enqueued with outbox.EnqueueTx is a row of outbox, written once.
// While it is unpublished it also has a narrow row in outbox_pending (its
// key, lane and failure state), which the relay claims and deletes when the
// event is published, appending (id, published_at) to outbox_published;
// cleanup and redrive work from that log. Triggers keep outbox_pending in
// step with inserts into and deletes from outbox, whoever makes them (see
// migration 008_outbox_pending.sql).
//
// outbox_pending is a queue table: every event inserts a row and deletes it
// soon after, and the relay's lane scans step over the index entries of the
// deleted rows until the table is vacuumed (measured once by hand, from the
// statement log of one drain: about 2 ms more per claim for every 25,000
// such rows). Keep autovacuum on, which it is by
// default. The table stays small, so its default trigger (a fifth of its
// rows dead) can fire often or rarely depending on the backlog; a fixed
// threshold makes it regular (not measured here, where autovacuum is off):
//
//	ALTER TABLE outbox_pending SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
//
// # Retention deletes
//
// The cleaner's deletes (RecordDeleteExpired, InboxDeleteBefore,
// OutboxDeletePublishedBefore, SagaDeleteFinishedBefore, and
// DeleteInboxDefaultBefore in partition mode) each read a batch from the
// table's retention index (its time column) from the cursor of the batch
// before on (driver.DeleteResult), in ranges of that index whatever the
// plan: the first BatchSize rows in index order, locked with FOR UPDATE
// SKIP LOCKED, then the rest of their last time value, sorted by the whole
// key; the first BatchSize of those are deleted, and the statement returns
// their count and the last one's key. While another transaction holds an
// old snapshot, the index entries of the rows deleted by the earlier
// batches of a sweep stay in the index; a batch reads over none of them
// but those of the cursor's own time value (measured with cleanupbench
// -hold-snapshot: 1.00 entries read per row deleted, where reading from
// the index's start read 101.5 for 200,000 rows in batches of 1000).
package pgdriver
