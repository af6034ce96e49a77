package dberr_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/dberr"
	"github.com/idemkit/idem/internal/testdb"
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
		// The database refuses writes (a hot standby after a failover,
		// default_transaction_read_only), or its server lacks a
		// resource: never the record's fault.
		{fmt.Errorf("inbox: %w", &pgconn.PgError{Code: "25006", Message: "cannot execute INSERT in a read-only transaction"}), true},
		{&pgconn.PgError{Code: "53000"}, true},
		{&pgconn.PgError{Code: "53100", Message: "could not extend file: No space left on device"}, true},
		{&pgconn.PgError{Code: "53200", Message: "out of memory"}, true},
		{&pgconn.PgError{Code: "53400", Message: "temporary file size exceeds temp_file_limit"}, true},
		{&pgconn.PgError{Code: "58000"}, true},
		{&pgconn.PgError{Code: "58030", Message: "could not read block"}, true},
		{&pgconn.PgError{Code: "58P01"}, true},
		{&pgconn.PgError{Code: "58P02"}, true},
		// A configuration an operator fixes: not passing (Misconfigured).
		{&pgconn.PgError{Code: "42501"}, false},
		{&pgconn.PgError{Severity: "FATAL", Code: "28P01"}, false},
		{&pgconn.PgError{Code: "54000"}, false}, // program_limit_exceeded: a record too large, say
		{&pgconn.PgError{Code: "25001"}, false}, // active_sql_transaction: a bug
		{fmt.Errorf("create order: %w", io.ErrUnexpectedEOF), true},
		{op, true},
		{sqldriver.ErrBadConn, true},
		{sql.ErrConnDone, true},
		{&url.Error{Op: "Post", URL: "http://x", Err: op}, false},
		{errors.New("bug"), false},
		// SQLite (modernc.org/sqlite's errors have a Code method): busy,
		// and a file that refuses writes or cannot grow: the database's.
		{fmt.Errorf("inbox: %w", sqliteErr(5)), true},
		{sqliteErr(5 | 2<<8), true}, // SQLITE_BUSY_SNAPSHOT
		{sqliteErr(6), true},
		{sqliteErr(8), true},         // SQLITE_READONLY
		{sqliteErr(10 | 3<<8), true}, // SQLITE_IOERR_WRITE
		{sqliteErr(13), true},        // SQLITE_FULL
		{sqliteErr(7), true},         // SQLITE_NOMEM
		{sqliteErr(14), true},        // SQLITE_CANTOPEN
		{sqliteErr(19), false},       // SQLITE_CONSTRAINT: the record's
		{sqliteErr(1), false},        // SQLITE_ERROR: a bad statement
		{sqliteErr(11), false},       // SQLITE_CORRUPT: Misconfigured
	} {
		if got := dberr.Transient(c.err); got != c.want {
			t.Errorf("Transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// sqliteErr stands in for modernc.org/sqlite's *sqlite.Error.
type sqliteErr int

func (e sqliteErr) Error() string { return fmt.Sprintf("sqlite error (%d)", int(e)) }
func (e sqliteErr) Code() int     { return int(e) }

func TestMisconfiguredSQLite(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{sqliteErr(3), true},                           // SQLITE_PERM
		{sqliteErr(11), true},                          // SQLITE_CORRUPT
		{fmt.Errorf("begin: %w", sqliteErr(26)), true}, // SQLITE_NOTADB
		{sqliteErr(23), true},                          // SQLITE_AUTH
		{sqliteErr(13), false},
		{sqliteErr(19), false},
		{errors.New("bug"), false},
	} {
		if got := dberr.Misconfigured(c.err); got != c.want {
			t.Errorf("Misconfigured(%v) = %v, want %v", c.err, got, c.want)
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

func TestTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("step: %w", &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}), true},
		{&pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}, true},
		{&pgconn.PgError{Code: "40P01"}, false}, // a deadlock: passing, not the statement's
		{&pgconn.PgError{Code: "08006"}, false},
		{errors.New("57014"), false},
	} {
		if got := dberr.Timeout(c.err); got != c.want {
			t.Errorf("Timeout(%v) = %v, want %v", c.err, got, c.want)
		}
		if c.want && !dberr.Transient(c.err) {
			t.Errorf("Timeout(%v) but not Transient", c.err)
		}
	}
}

func TestMisconfigured(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("inbox: event 0: %w", &pgconn.PgError{Code: "42501", Message: "permission denied for table effect"}), true},
		{fmt.Errorf("begin: %w", &pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: "password authentication failed"}), true},
		{&pgconn.PgError{Severity: "FATAL", Code: "28000", Message: "role is not permitted to log in"}, true},
		{&pgconn.PgError{Code: "25006"}, false},
		{&pgconn.PgError{Code: "42P01"}, false},
		{errors.New("permission denied"), false},
	} {
		if got := dberr.Misconfigured(c.err); got != c.want {
			t.Errorf("Misconfigured(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status map[string]string
		want   string // the parameter named, "" for nil
	}{
		{map[string]string{"in_hot_standby": "off", "default_transaction_read_only": "off"}, ""},
		{map[string]string{}, ""}, // before PostgreSQL 14, or behind a pooler
		{map[string]string{"in_hot_standby": "on", "default_transaction_read_only": "off"}, "in_hot_standby"},
		{map[string]string{"in_hot_standby": "off", "default_transaction_read_only": "on"}, "default_transaction_read_only"},
	} {
		err := dberr.ReadOnly(func(k string) string { return c.status[k] })
		switch {
		case c.want == "" && err != nil:
			t.Errorf("ReadOnly(%v) = %v, want nil", c.status, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want+" = on")):
			t.Errorf("ReadOnly(%v) = %v, want an error naming %s", c.status, err, c.want)
		case c.want != "" && (!dberr.Transient(fmt.Errorf("begin: %w", err)) || dberr.SQLState(err) != "25006"):
			t.Errorf("ReadOnly(%v) = %v: SQLSTATE %q; want 25006, transient", c.status, err, dberr.SQLState(err))
		}
	}
}

func TestFault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P01"}, true},                           // Transient
		{fmt.Errorf("insert: %w", &pgconn.PgError{Code: "42501"}), true}, // Misconfigured
		{fmt.Errorf("enqueue: %w", driver.ErrNotMigrated), true},
		{&pgconn.PgError{Code: "23505"}, false},
		{errors.New("bug"), false},
	} {
		if got := dberr.Fault(c.err); got != c.want {
			t.Errorf("Fault(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestTransientConnectionLost: a pooled connection whose server side went
// away (a proxy or the server restarted while it sat idle) fails its next
// statement with pgx's "conn closed" (pgconn.ErrConnClosed, not safe to
// retry since the statement may have been sent): a lost connection,
// transient like the reset it follows. It was classified as the work's
// own error (the relay logged ERROR, the consumer counted an attempt).
func TestTransientConnectionLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := testdb.NewProxy(t)
	pool := p.Pool(t, "public", 1)
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"exec", func() error { _, err := pool.Exec(ctx, "SELECT 1"); return err }},
		{"in a transaction", func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "SELECT 1")
			return err
		}},
		{"batch", func() error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			b.Queue("SELECT 2")
			return pool.SendBatch(ctx, b).Close()
		}},
	} {
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil { // a connection, idle in the pool
			t.Fatal(err)
		}
		for _, f := range p.BlackHoleAll() {
			f.Cut()
		}
		time.Sleep(100 * time.Millisecond) // the close reaches the client
		err := c.run()
		if err == nil {
			t.Fatalf("%s: no error on a connection whose server side was closed", c.name)
		}
		if !dberr.Transient(err) {
			t.Errorf("%s: Transient(%v) = false on a lost connection", c.name, err)
		}
	}
}
