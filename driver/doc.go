// Package driver is the storage interface that every idem backend implements.
//
// The interface is owned by idem and is UNSTABLE: it may change between minor
// versions. Application code should not call it directly; use the
// higher-level packages (idemhttp, inbox, outbox, cleanup, saga) and open a
// backend with one of the driver packages:
//
//   - driver/pgdriver: PostgreSQL through pgx v5 (pgxpool.Pool, pgx.Tx)
//   - driver/pgsqldriver: PostgreSQL through database/sql (*sql.DB, *sql.Tx)
//   - driver/sqlitedriver: SQLite through modernc.org/sqlite (*sql.DB, *sql.Tx)
//
// A Driver is generic over the transaction type TTx of its database library,
// as river's drivers are: code that must be atomic with a business write takes
// the caller's TTx and turns it into an executor with a ...Tx method
// (RecordsTx, InboxTx, OutboxTx, SagasTx), so idem's statements run in the
// caller's transaction and nothing commits behind the caller's back.
//
// Each component takes only what it uses: a Backend (name, capabilities,
// transactions) and the stores of its tables. idemhttp takes a
// RecordDriver, inbox an InboxDriver, outbox an OutboxDriver, saga a
// SagaDriver; the cleaner takes the whole Driver. A backend that serves only
// the middleware implements RecordDriver: Backend's five methods, Records
// and RecordsTx, and the six methods of RecordExecutor.
//
// Every executor method takes its inputs as one struct (a ...Params type,
// or a row such as OutboxRow), so a field added later breaks no backend and
// no caller.
//
// The retention deletes of the four tables (RecordDeleteExpired,
// InboxDeleteBefore, OutboxDeletePublishedBefore, SagaDeleteFinishedBefore)
// delete in batches, each of which resumes after the key of the last row
// the batch before it deleted: see DeleteResult.
//
// A full backend must pass the shared suite in driver/drivertest.
package driver
