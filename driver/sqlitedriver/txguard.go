package sqlitedriver

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"modernc.org/sqlite"

	"github.com/idemkit/idem/driver"
)

// SQLite ends a transaction by itself when a statement in it fails in some
// ways: a write interrupted (its context ended), SQLITE_FULL, an I/O error.
// database/sql does not know: the *sql.Tx still looks open, and its next
// statements would run outside any transaction, each committed on its own,
// before Commit fails ("no transaction is active"). The transaction guard
// closes that gap on the connections idem opens: once SQLite has rolled
// back a transaction begun by Driver.Begin, every later write on the
// connection fails (the commit hook turns its commit into a rollback) until
// database/sql ends the transaction (COMMIT, which then fails, or
// ROLLBACK).
//
// The guard is installed by a connection hook, only on the connections
// whose DSN carries txGuardParam (DSN adds it): it is registered on the
// "sqlite" driver, so that the functions, collations and hooks an
// application registers there stay in force on idem's connections, but it
// leaves every other connection alone. SQLite ignores the unknown URI
// parameter.
const txGuardParam = "idem_txguard"

// txGuardArm is the statement Driver.Begin runs first in a transaction to
// arm the guard: a PRAGMA SQLite does not know, which it ignores, but the
// authorizer is shown (at prepare time, which database/sql's ExecContext
// with a text follows at once). Arming after BEGIN, rather than on seeing
// BEGIN, keeps a BEGIN that failed (busy, its context ended) from arming a
// connection that is not in a transaction.
const (
	txGuardPragma = "idem_txguard_arm"
	txGuardArm    = "PRAGMA " + txGuardPragma
)

func init() {
	sqlite.RegisterConnectionHook(func(c sqlite.ExecQuerierContext, dsn string) error {
		if !hasTxGuardParam(dsn) {
			return nil
		}
		return installTxGuard(c)
	})
}

// hasTxGuardParam reports whether dsn asks for the transaction guard.
func hasTxGuardParam(dsn string) bool {
	_, query, ok := strings.Cut(dsn, "?")
	if !ok {
		return false
	}
	q, err := url.ParseQuery(query)
	return err == nil && q.Get(txGuardParam) == "1"
}

// errTxRolledBack explains the errors of statements the guard refused.
// It wraps driver.ErrTxAborted: nothing of the transaction commits.
var errTxRolledBack = fmt.Errorf("%w: SQLite had already rolled the transaction back (a statement in it was interrupted by its context, the disk was full, or an I/O error); nothing of it is committed: roll it back and retry", driver.ErrTxAborted)

// txGuard is the guard's state on one connection. database/sql uses a
// connection from one goroutine at a time; the mutex only makes that
// explicit to the race detector.
type txGuard struct {
	mu sync.Mutex
	// armed: a transaction begun by Driver.Begin is open.
	armed bool
	// broken: SQLite rolled the armed transaction back by itself; writes
	// fail until database/sql ends it.
	broken bool
}

func installTxGuard(c any) error {
	hooks, ok := c.(sqlite.HookRegisterer)
	auth, ok2 := c.(sqlite.AuthorizerRegisterer)
	if !ok || !ok2 {
		return fmt.Errorf("sqlitedriver: the sqlite connection %T has no commit, rollback or authorizer hooks", c)
	}
	g := &txGuard{}
	if err := auth.RegisterAuthorizer(g.authorize); err != nil {
		return fmt.Errorf("sqlitedriver: install the transaction guard: %w", err)
	}
	hooks.RegisterCommitHook(g.commit)
	hooks.RegisterRollbackHook(g.rollback)
	return nil
}

// authorize sees every statement as it is prepared. BEGIN, COMMIT and
// ROLLBACK (not ROLLBACK TO, a savepoint's) reset the guard: database/sql
// starts or ends a transaction. txGuardArm arms it. Nothing is refused.
func (g *txGuard) authorize(action sqlite.AuthorizerActionCode, arg1, _, _, _ string) sqlite.AuthorizerReturnCode {
	switch {
	case action == sqlite.AuthTransaction:
		g.mu.Lock()
		g.armed, g.broken = false, false
		g.mu.Unlock()
	case action == sqlite.AuthPragma && strings.EqualFold(arg1, txGuardPragma):
		g.mu.Lock()
		g.armed, g.broken = true, false
		g.mu.Unlock()
	}
	return sqlite.AuthorizerOK
}

// rollback runs when SQLite rolls a transaction back. An explicit ROLLBACK
// has disarmed the guard when it was prepared; a rollback of the armed
// transaction is SQLite's own.
func (g *txGuard) rollback() {
	g.mu.Lock()
	if g.armed {
		g.armed, g.broken = false, true
	}
	g.mu.Unlock()
}

// commit runs when a write transaction commits: non-zero turns the commit
// into a rollback, and the statement fails with
// SQLITE_CONSTRAINT_COMMITHOOK.
func (g *txGuard) commit() int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broken {
		return 1
	}
	return 0
}

// Extended result codes mapErr and Commit recognise.
const (
	sqliteConstraintCommitHook = 531 // SQLITE_CONSTRAINT_COMMITHOOK
)

// isTxRolledBack reports whether err is the guard refusing a write.
func isTxRolledBack(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code() == sqliteConstraintCommitHook
}

// noTxActive reports whether err is SQLite's COMMIT or ROLLBACK finding no
// transaction: SQLite had rolled it back by itself.
func noTxActive(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no transaction is active")
}
