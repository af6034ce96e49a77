// Package uniq turns a database UNIQUE constraint into the second line of
// defence for money (R-DIST-IDEM-4): the client's Idempotency-Key catches a
// retry with the same key, the constraint catches the same business
// operation sent under another key (a client that generated a new key on
// retry, two replicas of a batch job, ...).
//
// Declare the constraint once, next to the table's migration:
//
//	var paymentKey = uniq.Constraint{
//		Name:    "payment_provider_external_id_key",
//		Table:   "payment",
//		Columns: []string{"payment_provider", "external_payment_id"},
//	}
//
// then create the row with CreateOrGet: on a violation of that constraint
// (and only that one) it loads the row that won and reports created=false,
// so the handler answers with the existing payment instead of failing or
// creating a second one. The row that won holds the constraint's key, and
// nothing more is known of it: compare it with what the request sent (the
// amount, the currency, the customer) and answer 409 Conflict when they
// differ. Answering 200 with it would tell a client whose payment was
// never created that it exists. Is recognises the violation on PostgreSQL (pgx:
// SQLSTATE 23505 and the constraint's Name) and on SQLite (modernc.org/sqlite:
// extended code SQLITE_CONSTRAINT_UNIQUE or SQLITE_CONSTRAINT_PRIMARYKEY and
// exactly the Table and Columns of the constraint, in index order). Name is
// required on PostgreSQL: CreateOrGet with a Constraint without Name returns
// an error saying so at the first PostgreSQL unique violation, instead of
// never recognising a duplicate.
//
// # Transactions
//
// On PostgreSQL a failed statement aborts the whole transaction: after the
// unique violation every further statement, including get, fails with
// "current transaction is aborted". Inside a transaction, and above all one
// the code does not own (an idemhttp ModeTx handler's, from
// idemhttp.TxFromContext), use CreateOrGetTx with a pgx.Tx or
// CreateOrGetSQLTx with a *sql.Tx (PostgreSQL or SQLite): they run create
// in a savepoint they take and release, so the violation rolls back only
// create's statements, then run get in the transaction. Any other error of
// create is returned as it is, its writes rolled back to the savepoint too,
// and the transaction stays usable: its owner decides whether to go on and
// commit. SavepointTx and SavepointSQLTx are the savepoint alone, for other
// statements allowed to fail.
//
// SQLite rolls back just the failing statement: with CreateOrGet, when
// create is that one INSERT, no savepoint is needed there. When create
// writes anything before it (an audit row, an outbox event), use
// CreateOrGetSQLTx (or SavepointSQLTx) on SQLite too, or the losing
// attempt's earlier writes commit with the caller's transaction.
//
// get must see the row committed by the concurrent winner. That holds in
// PostgreSQL's default READ COMMITTED isolation (every statement takes a new
// snapshot, and the losing INSERT waits for the winner to commit before it
// fails) and on SQLite (writers are serialised). Under REPEATABLE READ or
// SERIALIZABLE the winner's row is invisible to the loser's snapshot: get
// finds nothing and CreateOrGet returns its error.
//
// The constraint must be checked when the INSERT runs. A PostgreSQL
// constraint declared DEFERRABLE INITIALLY DEFERRED (or deferred with SET
// CONSTRAINTS) is checked at COMMIT: the duplicate INSERT succeeds,
// CreateOrGet reports created=true, and the violation fails the caller's
// COMMIT, outside CreateOrGet, rolling back the whole transaction. Declare
// it NOT DEFERRABLE (the default), or SET CONSTRAINTS name IMMEDIATE in
// the transaction before CreateOrGet.
package uniq
