// Package dberr classifies the errors of database drivers (pgx, pgconn,
// lib/pq, database/sql, SQLite) for the code that decides whether a
// failure is worth retrying: idemkafka's batch handler, idemd's HTTP
// handlers and saga's Compensate (a database fault is not a failed
// attempt of a compensation).
package dberr

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"

	"github.com/idemkit/idem/driver"
)

// Transient reports whether err is a database's passing failure rather
// than the caller's: PostgreSQL's serialization failure, deadlock, lock and
// statement timeouts, shutdown, a session ended by the server's
// idle_in_transaction_session_timeout (25P03), transaction_timeout (25P04)
// or idle_session_timeout (57P05), connection classes (08), a database
// that refuses writes (25006 read_only_sql_transaction: a hot standby that
// a pool reached after a failover, default_transaction_read_only set for
// maintenance), the server's resources (class 53: a full disk, out of
// memory, too many connections, a configuration limit such as
// temp_file_limit) and system errors (class 58: an I/O error, a file
// missing), all by SQLSTATE as pgx, pgconn and lib/pq report it; SQLite's
// BUSY and LOCKED, and its file that refuses writes or cannot grow or be
// read (READONLY: a filesystem remounted read-only; FULL: a full disk;
// IOERR, NOMEM, CANTOPEN, PROTOCOL); driver.ErrLockTimeout; and a lost or
// failing database connection: pgconn's errors that are safe to retry or
// timeouts,
// *net.OpError, io.ErrUnexpectedEOF, database/sql's driver.ErrBadConn and
// sql.ErrConnDone. Any other error is not, an HTTP client's (*url.Error)
// among them even when it wraps a network error, and so is a privilege or
// login refused (Misconfigured), which lasts until an operator acts.
//
// Each of these ends the transaction it happened in without committing it,
// except at COMMIT: a connection lost then leaves the outcome unknown, and
// Transient does not tell the two apart.
func Transient(err error) bool {
	if code := SQLState(err); code != "" {
		switch {
		case code == "40001", code == "40P01", code == "55P03", code == "57014",
			code == "57P01", code == "57P02", code == "57P03", code == "53300",
			// The server ended the session (FATAL): every statement
			// after it fails with a lost connection, transient too.
			code == "25P03", code == "25P04", code == "57P05",
			// Not writable now (a standby, read-only for a while).
			code == "25006",
			strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"),
			strings.HasPrefix(code, "58"):
			return true
		}
	}
	switch sqliteCode(err) {
	case sqliteBusy, sqliteLocked, sqliteNoMem, sqliteReadOnly, sqliteIOErr, sqliteFull, sqliteCantOpen, sqliteProtocol:
		return true
	}
	if errors.Is(err, driver.ErrLockTimeout) {
		return true
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		// An HTTP call's failure, even a refused connection: not the
		// database's.
		return false
	}
	// pgconn's errors (all with a SafeToRetry method): failed before
	// anything was sent, or timed out (pgconn.Timeout: a net.Error
	// timeout or a context deadline underneath).
	var pg interface{ SafeToRetry() bool }
	if errors.As(err, &pg) {
		var ne net.Error
		if pg.SafeToRetry() || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) ||
			connClosed(err) {
			return true
		}
	}
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, sqldriver.ErrBadConn) || errors.Is(err, sql.ErrConnDone)
}

// connClosed reports whether err's chain (followed through errors.Unwrap,
// as pgx and idem wrap) holds pgconn.ErrConnClosed, matched by its text so that this package needs no pgx: the connection
// was lost (its server side closed while it sat in the pool, or earlier
// in the same operation), after the statement may have been sent, so
// pgconn does not call it safe to retry; it is a lost connection all the
// same.
func connClosed(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == "conn closed" {
			return true
		}
	}
	return false
}

// Fault reports whether err is the database's fault rather than its
// caller's (a record's, a request's, a compensation's): a passing failure
// (Transient), one an operator fixes (Misconfigured), or idem's tables
// missing (driver.ErrNotMigrated). Retrying the same work at once would
// most likely fail the same way, and blaming the work for it (a dead
// letter, a saga marked Failed) would report work nothing is wrong with.
// saga's Compensate makes one exception: a Timeout of a compensation's own
// statement is a failed attempt (a saga Failed is retried later, not
// skipped as a dead letter is).
func Fault(err error) bool {
	return Transient(err) || Misconfigured(err) || errors.Is(err, driver.ErrNotMigrated)
}

// Timeout reports whether err is PostgreSQL cancelling a statement:
// statement_timeout ran out (57014 query_canceled, also a cancel request:
// pg_cancel_backend, a context that ended) or lock_timeout did (55P03
// lock_not_available). Both are Transient. A caller that ran the statement
// itself may count it against its own work rather than the database's: a
// statement that always runs longer than the limit, or waits for a lock
// that is never released, fails the same way on every retry.
func Timeout(err error) bool {
	code := SQLState(err)
	return code == "57014" || code == "55P03"
}

// Misconfigured reports whether err is PostgreSQL refusing the role a
// privilege (42501 insufficient_privilege: a GRANT revoked, a role
// misconfigured) or a login (class 28: a password rotated under a running
// service, a role set NOLOGIN, no pg_hba.conf entry). Retrying does not
// help and no record or request is at fault: an operator must act, as
// when idem's tables are missing (driver.ErrNotMigrated). 42501 is also
// a row refused by a row-level security policy; a handler that relies
// on one to refuse records must say so itself (idemkafka.ErrPoison).
// On SQLite: access to the file denied (PERM, AUTH), or a file that is
// corrupt or not a database (CORRUPT, NOTADB).
func Misconfigured(err error) bool {
	if code := SQLState(err); code == "42501" || strings.HasPrefix(code, "28") {
		return true
	}
	switch sqliteCode(err) {
	case sqlitePerm, sqliteCorrupt, sqliteAuth, sqliteNotADB:
		return true
	}
	return false
}

// SQLite's primary result codes (the low byte of an extended one).
const (
	sqlitePerm     = 3  // SQLITE_PERM: access permission denied
	sqliteBusy     = 5  // SQLITE_BUSY
	sqliteLocked   = 6  // SQLITE_LOCKED
	sqliteNoMem    = 7  // SQLITE_NOMEM
	sqliteReadOnly = 8  // SQLITE_READONLY: the file or its filesystem refuses writes
	sqliteIOErr    = 10 // SQLITE_IOERR
	sqliteCorrupt  = 11 // SQLITE_CORRUPT
	sqliteFull     = 13 // SQLITE_FULL: the disk is full (or max_page_count reached)
	sqliteCantOpen = 14 // SQLITE_CANTOPEN
	sqliteProtocol = 15 // SQLITE_PROTOCOL: a file-locking protocol error
	sqliteAuth     = 23 // SQLITE_AUTH
	sqliteNotADB   = 26 // SQLITE_NOTADB
)

// sqliteCode returns the primary result code of a SQLite error (any error
// with a Code() int method, as modernc.org/sqlite's *sqlite.Error), or 0.
func sqliteCode(err error) int {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		return coded.Code() & 0xff
	}
	return 0
}

// ReadOnly returns an error whose SQLSTATE is 25006
// (read_only_sql_transaction, so Transient) when the session whose
// reported run-time parameters status returns (pgconn's ParameterStatus)
// is read-only, and nil otherwise: a hot standby (in_hot_standby), or
// default_transaction_read_only set for the role, the database or the
// server. PostgreSQL 14 and later report both to the client when the
// session starts and whenever they change, with the ReadyForQuery of the
// statement during which they did: reading them costs no round trip.
// Before 14, and behind a pooler that does not pass them on, status
// returns "" and ReadOnly nil.
func ReadOnly(status func(name string) string) error {
	for _, p := range [...]string{"in_hot_standby", "default_transaction_read_only"} {
		if status(p) == "on" {
			return &readOnlyError{param: p}
		}
	}
	return nil
}

// ReadOnlySession is ReadOnly's error for a session whose parameter param
// (transaction_read_only, as a driver that cannot read what the server
// reported asks it) is on.
func ReadOnlySession(param string) error { return &readOnlyError{param: param} }

// readOnlyError is ReadOnly's error.
type readOnlyError struct{ param string }

func (e *readOnlyError) Error() string {
	return "the database session is read-only (" + e.param + " = on): a hot standby, or a database or role set read-only"
}

// SQLState returns 25006 (read_only_sql_transaction).
func (e *readOnlyError) SQLState() string { return "25006" }

// IdleTimeout reports whether err is PostgreSQL's end of a session that
// waited for its client longer than idle_in_transaction_session_timeout
// (25P03) or idle_session_timeout (57P05). The server ends such a session
// only while it waits for the client's next statement, and checks for a
// timeout due at the moment a statement arrives before running it: nothing
// the client sent after the pause ran, a COMMIT included.
func IdleTimeout(err error) bool {
	code := SQLState(err)
	return code == "25P03" || code == "57P05"
}

// SQLState returns the SQLSTATE of err (pgconn.PgError, lib/pq's Error or
// any error with a SQLState method), or "".
func SQLState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}
