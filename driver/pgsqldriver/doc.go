// Package pgsqldriver is idem's PostgreSQL backend over database/sql: a
// driver.Driver[*sql.Tx] on a *sql.DB, for applications whose data access
// (sqlc, sqlx, bun, ent, gorm, plain database/sql) holds a *sql.Tx rather
// than a pgx.Tx.
//
//	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/app") // import _ "github.com/jackc/pgx/v5/stdlib"
//	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: "idem"})
//	err = drv.Migrate(ctx)
//
// The transaction type is *sql.Tx: idem's statements that must be atomic
// with a business write run in the caller's *sql.Tx, so sqlc's
// Queries.WithTx(tx), sqlx's Tx or bun's Tx (whose underlying *sql.Tx it
// is) write in the same transaction as the idempotency record, the inbox
// row or the outbox event.
//
// It has pgdriver's schema, migrations, migration table (with what each
// migration records of the binaries that predate it: see "Older and newer
// binaries on one schema" in pgdriver's documentation), advisory locks and
// SQL (the statements are shared), and the same Config: the two drivers can
// run on one database at the same time, and a service can move from one to
// the other without migrating anything. It implements driver.TxClaimer
// (idemhttp's ModeTx fast path) with pgdriver's key lock, and bounds waits
// for a concurrent claim (driver.RecordClaimParams.LockTimeout) with a
// transaction-local lock_timeout, as pgdriver does.
//
// The *sql.Tx of BeginClaim (idemhttp's ModeTx) is a plain one: unlike
// pgdriver's, whose Commit and Rollback the handler cannot call, and
// sqlitedriver's, whose COMMIT without the record is turned into a
// rollback, it commits when the handler calls its Commit. The handler must
// not: its writes are then committed without the idempotency record,
// idemhttp answers 500 transaction-ended (the effect may have been
// applied), and a retry with the same key executes the command again, a
// double effect. (database/sql gives the driver no say in a Commit, and
// PostgreSQL no hook at COMMIT short of a deferred constraint trigger on a
// row written at the claim: an extra write and migration on every request,
// so there is no guard here.)
//
// Commit, Rollback and CommitComplete are bounded by their ctx, as
// pgdriver's: a COMMIT that PostgreSQL does not answer is given up when
// ctx ends (its outcome unknown) and its connection closed. database/sql
// sends a *sql.Tx's COMMIT and ROLLBACK on the context the transaction
// began with, so Begin and BeginClaim begin theirs on a context of the
// driver's, which ends with the caller's until Commit, Rollback or
// CommitComplete (database/sql still rolls the transaction back when the
// caller's context ends before then). A *sql.Tx's own Commit and Rollback
// stay bounded by the context of Begin. It costs about 3 us and 16 to 19
// allocations a transaction begun on a request's context.
//
// Choose pgdriver when the application uses pgx directly: it pipelines the
// statements of a claim, of BeginClaim/CommitComplete and of the outbox
// claim into one round trip each, where this driver sends them one by one
// (two to five round trips), so it is slower per request.
//
// Its relays are woken by LISTEN/NOTIFY, like pgdriver's, when the
// database/sql driver is pgx's stdlib: ListenOutbox (outbox.Notifier) opens
// a connection of its own for the listener, with the settings of the
// *sql.DB's (it holds none of the pool's). With another driver
// (lib/pq) there is no listener and the relays poll
// (outbox.RelayConfig.PollInterval); OutboxInsert notifies OutboxChannel
// either way, so a pgdriver listener on the same database is woken too.
//
// Its retention deletes are pgdriver's statements (see pgdriver's
// "Retention deletes"): each batch resumes after the key of the batch
// before (driver.DeleteResult).
//
// This driver lacks inbox partitioning (pgdriver's EnableInboxPartitioning
// and the cleanup.InboxPartitioner methods): InboxDeleteBefore works on a
// partitioned processed_event, but the cleaner's partition mode needs
// pgdriver.
//
// The driver uses no pgx type: array parameters are sent as PostgreSQL
// array literals in text and errors are read through their SQLState()
// method. Its tests run over the pgx stdlib driver
// ("github.com/jackc/pgx/v5/stdlib"), and the driver conformance suite
// (package drivertest) over lib/pq v1.12.3 too (TestDriverLibPQ). With
// lib/pq, keep its default (unnamed prepared statements) and do not use
// binary_parameters. lib/pq does not end a statement when its context
// ends: it sends PostgreSQL a cancel request and goes on waiting for the
// answer. So the bounds above do not hold with it: a COMMIT (or any
// statement) that PostgreSQL does not answer (a network partition that
// resets nothing, a hung server) holds the caller, its connection and,
// in idemhttp, the request and its key past Config.CommitTimeout, until
// the operating system gives up on the socket (with lib/pq v1.12.3 and
// a COMMIT black-holed, idemhttp with a CommitTimeout of 1s had not
// answered 20s later; over the pgx stdlib driver it answers 503
// outcome-unknown within about 1s). Use the pgx stdlib driver where
// that matters, and keep TCP keepalives short (docs/problems.md,
// outcome-unknown).
package pgsqldriver
