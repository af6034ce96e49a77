package dberr_test

import (
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/dberr"
)

func TestTransient(t *testing.T) {
	t.Parallel()
	op := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("outbox insert: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}), true},
		{&pgconn.PgError{Code: "08006"}, true},
		// Sessions ended by the server's idle_in_transaction_session_timeout,
		// transaction_timeout and idle_session_timeout.
		{fmt.Errorf("inbox: event 5: %w", &pgconn.PgError{Severity: "FATAL", Code: "25P03"}), true},
		{&pgconn.PgError{Severity: "FATAL", Code: "25P04"}, true},
		{&pgconn.PgError{Severity: "FATAL", Code: "57P05"}, true},
		{&pgconn.PgError{Code: "25P02"}, false}, // in failed sql transaction: the handler ignored an error
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "23505"}, false},
		{fmt.Errorf("create order: %w", io.ErrUnexpectedEOF), true},
		{op, true},
		{sqldriver.ErrBadConn, true},
		{sql.ErrConnDone, true},
		{&url.Error{Op: "Post", URL: "http://x", Err: op}, false},
		{errors.New("bug"), false},
	} {
		if got := dberr.Transient(c.err); got != c.want {
			t.Errorf("Transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestIdleTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("commit complete: %w", &pgconn.PgError{Severity: "FATAL", Code: "25P03"}), true},
		{&pgconn.PgError{Severity: "FATAL", Code: "57P05"}, true},
		{&pgconn.PgError{Severity: "FATAL", Code: "57P01"}, false}, // may strike during a COMMIT
		{&pgconn.PgError{Severity: "FATAL", Code: "25P04"}, false}, // transaction_timeout: also while a statement runs
		{errors.New("25P03"), false},
	} {
		if got := dberr.IdleTimeout(c.err); got != c.want {
			t.Errorf("IdleTimeout(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
