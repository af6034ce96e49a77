// Package sqlitedriver is idem's SQLite backend, built on modernc.org/sqlite
// (pure Go, no cgo).
//
//	drv, err := sqlitedriver.Open("app.db", nil)
//	err = drv.Migrate(ctx)
//	db := drv.DB() // the application's own queries use the same *sql.DB
//
// Migrations are embedded, numbered SQL files, as pgdriver's; each declares
// whether binaries that predate it may run against a schema that has it,
// and Migrate records that in idem_migration (compatible_from): Validate,
// Migrate and MigrateTx accept a schema a newer binary migrated when every
// version they do not know accepts them, and refuse it otherwise (see
// "Older and newer binaries on one schema" in pgdriver's documentation).
//
// Open configures the database the way idem's guarantees need it: WAL
// journal, synchronous=FULL (a committed transaction survives power loss),
// a busy timeout for other processes on the same file, foreign keys on,
// a journal_size_limit of 64 MiB (the -wal file, grown while another
// connection held a read snapshot, is cut back to it once the log starts
// over instead of keeping its largest size),
// write transactions started with BEGIN IMMEDIATE, and a single connection,
// so that writers in this process are serialised instead of failing with
// SQLITE_BUSY. The consequence: a handler that holds a transaction must do
// all its database work through that transaction (opening a second one from
// the same *sql.DB waits for the first and deadlocks). idemhttp's claims
// (BeginClaim, and RecordClaim outside a transaction) bound their wait for
// that connection by idemhttp.Config.Wait (the claim's LockTimeout), while
// another transaction holds it: a claim whose process was too slow to take
// a free connection within the wait (a stalled, loaded machine) keeps
// waiting for it; other calls wait as long as their context allows.
//
// Open refuses, saying why, a path whose directory does not exist, a path
// that is a directory, a directory this process may not write when the
// file is yet to be created (or its -wal and -shm files are), and an
// existing file (or its -wal or -shm file) this process may not write,
// which SQLite would open read-only without a word, every write then
// failing ("attempt to write a readonly database").
//
// Every process that opens the file must run on the same host, the file on
// a local file system: SQLite's WAL shares its -shm memory and locks
// between them, which a network file system (NFS, SMB, EFS) does not
// provide. Processes on several hosts, or a file on such a file system,
// can corrupt the database; use PostgreSQL for that.
//
// The transaction type is *sql.Tx. Times are stored as Unix microseconds.
//
// SQLite ends a transaction by itself when a write in it is interrupted (the
// statement's context ended: a deadline shorter than the transaction's), the
// disk is full or an I/O error occurs, and database/sql does not notice: the
// *sql.Tx still looks open, and its later statements would run outside any
// transaction, each committed on its own, before Commit failed with "cannot
// commit - no transaction is active". On the connections of Open (and of a
// *sql.DB opened with DSN) a guard prevents that for the transactions of
// Begin (BeginClaim's, Migrate's): once SQLite has rolled one back, every
// later write in it fails (the driver's methods say so; a statement of
// yours fails with "constraint failed (531)", SQLITE_CONSTRAINT_COMMITHOOK),
// Commit fails, and nothing of the transaction is committed; roll it back
// (Rollback then returns nil) and retry. Reads in it still succeed, seeing
// the database without the transaction's writes. The guard is a commit
// hook, a rollback hook and an authorizer that the package installs, with a
// connection hook on the "sqlite" driver, on the connections whose DSN
// carries DSN's idem_txguard parameter only (an authorizer or commit or
// rollback hook of your own on them would replace it). A transaction begun
// on DB() directly is not guarded: begin it with Begin, or run its
// statements with the transaction's context.
//
// On the same connections a transaction of BeginClaim (idemhttp's ModeTx)
// commits only with its completed record (CommitComplete): code run in it
// that commits it itself (a handler calling its Commit) gets an error
// ("constraint failed (531)") and the transaction is rolled back, so its
// writes are not committed without the record; CommitComplete then
// returns an error that is both driver.ErrTxDone and driver.ErrTxAborted
// (idemhttp answers 500 transaction-ended saying that nothing was
// committed; a retry executes once). Commit of such a transaction fails
// the same way. This costs no statement: BeginClaim arms the guard with
// the claim in place of Begin's arming statement, and CommitComplete sets
// an in-process flag. It needs transactions begun IMMEDIATE (DSN's
// _txlock=immediate); on other connections, and on a *sql.DB not opened
// with DSN, the handler's Commit commits.
//
// SQLite compiles a statement every time it runs from its text, which on a
// small statement costs about as much as running it. The driver therefore
// keeps its statements prepared, all but a few: those whose text it builds
// per call (multi-row outbox INSERTs, marks of several events), outbox
// redrives, CommitComplete's upsert that replaces an expired record, the
// statement that arms the transaction guard in Begin (the guard sees it
// only as it is prepared), and those of Migrate and Validate. A statement
// is prepared on the
// database, never from inside a transaction (that would wait for the single
// connection the transaction holds): one first met in a transaction runs
// from its text there and is prepared in the background once the
// connection is free; one whose preparation fails (its table does not
// exist yet) runs from its text and is prepared again 5 s later. The
// statements live until Close, which closes them without waiting for calls
// in flight; SQLite recompiles them by itself after a schema change. A
// transaction may be used by several goroutines at once: all uses of a
// statement on one connection share its compiled form, so a use that finds
// it taken (the rows of another are still open) runs from its text, as does
// a call in a transaction of another *sql.DB than the driver's.
//
// The retention deletes resume each batch after the key of the batch before
// (driver.DeleteResult), in the order of the table's retention index:
// every table is WITHOUT ROWID but outbox, whose id is its rowid, so each
// such index holds the time and then the rest of the key, and a batch is
// one range read of it, each entry read once.
package sqlitedriver
