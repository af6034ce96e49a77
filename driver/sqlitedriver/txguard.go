package sqlitedriver

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

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
// The guard also keeps a transaction of BeginClaim from committing without
// its completed record: code run in it (idemhttp's handler) that commits it
// itself would commit its effect with no record, and a retry would execute
// it again. BeginClaim arms the guard with a claim mark (txGuardClaim); its
// COMMIT is turned into a rollback unless CommitComplete, having written
// the record, marked the claim complete. The mark is an in-process flag
// shared by the driver and the connection's guard; it costs no statement.
// It is honoured on connections whose transactions begin IMMEDIATE only
// (DSN's _txlock=immediate): there every COMMIT of the transaction reaches
// the commit hook, which forgets the mark. (SQLite calls no hook at the
// COMMIT of a transaction that never wrote, which a DEFERRED one may be;
// the mark would outlive it.)
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

// txGuardClaimPragma arms the guard for a transaction of BeginClaim, in
// place of txGuardArm (the same single statement): its value names the
// transaction's claim mark in claimMarks.
const txGuardClaimPragma = "idem_txguard_claim"

// claimMark is the guard's flag for one transaction of BeginClaim.
type claimMark struct {
	// guarded: the connection's guard took the mark; the transaction
	// commits only once complete is set.
	guarded atomic.Bool
	// complete: CommitComplete wrote the completed record; the COMMIT
	// may proceed.
	complete atomic.Bool
	// refused: the guard turned a COMMIT without the record into a
	// rollback.
	refused atomic.Bool
	// release detaches the transaction from its caller's context (see
	// beginWithin); set before the mark is stored.
	release func()
}

// ended runs, once the transaction of BeginClaim has ended, what must then
// run (release). m may be nil: not a transaction of BeginClaim, or its mark
// already taken.
func (m *claimMark) ended() {
	if m != nil && m.release != nil {
		m.release()
	}
}

// claimMarks holds the claim marks of the open transactions of BeginClaim,
// by claimKey of their *sql.Tx: BeginClaim stores one, the guard finds it
// by the key in txGuardClaim's value, and the driver's methods that end the
// transaction (CommitComplete, Commit, Rollback, RollbackEnded) remove it
// and run its ended. A mark left behind (a transaction of BeginClaim ended
// with (*sql.Tx).Commit or Rollback directly, and no call of the driver
// after it) is replaced by the next transaction at that address; its
// release never runs, and the transaction's context stays attached to the
// caller's until that ends.
var claimMarks sync.Map

// claimKey identifies tx among the open transactions.
func claimKey(tx *sql.Tx) uintptr { return reflect.ValueOf(tx).Pointer() }

// txGuardClaim is the statement that arms the guard for the transaction
// whose key is key.
func txGuardClaim(key uintptr) string {
	return "PRAGMA " + txGuardClaimPragma + " = " + strconv.FormatUint(uint64(key), 10)
}

// markClaim stores m as tx's claim mark and returns the statement that
// arms the guard with it.
func markClaim(tx *sql.Tx, m *claimMark) string {
	key := claimKey(tx)
	claimMarks.Store(key, m)
	return txGuardClaim(key)
}

// takeClaim removes tx's claim mark and returns it, or nil.
func takeClaim(tx *sql.Tx) *claimMark {
	if m, ok := claimMarks.LoadAndDelete(claimKey(tx)); ok {
		return m.(*claimMark)
	}
	return nil
}

func init() {
	sqlite.RegisterConnectionHook(func(c sqlite.ExecQuerierContext, dsn string) error {
		guard, immediate := txGuardParams(dsn)
		if !guard {
			return nil
		}
		return installTxGuard(c, immediate)
	})
}

// txGuardParams reports whether dsn asks for the transaction guard, and
// whether its transactions begin IMMEDIATE.
func txGuardParams(dsn string) (guard, immediate bool) {
	_, query, ok := strings.Cut(dsn, "?")
	if !ok {
		return false, false
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return false, false
	}
	return q.Get(txGuardParam) == "1", strings.EqualFold(q.Get("_txlock"), "immediate")
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
	// immediate: the connection's transactions begin IMMEDIATE; claim
	// marks are honoured.
	immediate bool
	// claim: the open transaction is BeginClaim's; it commits only once
	// the mark is complete.
	claim *claimMark
}

func installTxGuard(c any, immediate bool) error {
	hooks, ok := c.(sqlite.HookRegisterer)
	auth, ok2 := c.(sqlite.AuthorizerRegisterer)
	if !ok || !ok2 {
		return fmt.Errorf("sqlitedriver: the sqlite connection %T has no commit, rollback or authorizer hooks", c)
	}
	g := &txGuard{immediate: immediate}
	if err := auth.RegisterAuthorizer(g.authorize); err != nil {
		return fmt.Errorf("sqlitedriver: install the transaction guard: %w", err)
	}
	hooks.RegisterCommitHook(g.commit)
	hooks.RegisterRollbackHook(g.rollback)
	return nil
}

// authorize sees every statement as it is prepared. BEGIN, COMMIT and
// ROLLBACK (not ROLLBACK TO, a savepoint's) reset the guard: database/sql
// starts or ends a transaction; a claim mark stays for the commit hook to
// see at COMMIT. txGuardArm arms it, txGuardClaim arms it with a claim
// mark. Nothing is refused.
func (g *txGuard) authorize(action sqlite.AuthorizerActionCode, arg1, arg2, _, _ string) sqlite.AuthorizerReturnCode {
	switch {
	case action == sqlite.AuthTransaction:
		g.mu.Lock()
		g.armed, g.broken = false, false
		if !strings.EqualFold(arg1, "COMMIT") {
			g.claim = nil
		}
		g.mu.Unlock()
	case action == sqlite.AuthPragma && strings.EqualFold(arg1, txGuardPragma):
		g.mu.Lock()
		g.armed, g.broken, g.claim = true, false, nil
		g.mu.Unlock()
	case action == sqlite.AuthPragma && strings.EqualFold(arg1, txGuardClaimPragma):
		var m *claimMark
		if key, err := strconv.ParseUint(arg2, 10, 64); err == nil && g.immediate {
			if v, ok := claimMarks.Load(uintptr(key)); ok {
				m = v.(*claimMark)
				m.guarded.Store(true)
			}
		}
		g.mu.Lock()
		g.armed, g.broken, g.claim = true, false, m
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
	g.claim = nil
	g.mu.Unlock()
}

// commit runs when a write transaction commits: non-zero turns the commit
// into a rollback, and the statement fails with
// SQLITE_CONSTRAINT_COMMITHOOK. A transaction of BeginClaim commits only
// with its completed record.
func (g *txGuard) commit() int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broken {
		return 1
	}
	if m := g.claim; m != nil {
		g.claim = nil
		if !m.complete.Load() {
			m.refused.Store(true)
			return 1
		}
	}
	return 0
}

// errClaimCommit explains the error of a COMMIT of a transaction of
// BeginClaim that the guard refused: nothing of the transaction commits.
var errClaimCommit = nothingCommitted{errors.New("a transaction of BeginClaim commits only with its completed record (CommitComplete); this COMMIT was turned into a rollback, nothing of it is committed")}

// errClaimEnded explains CommitComplete (or RollbackEnded: op) finding its
// transaction ended by the code run in it on a guarded connection: the
// guard had refused its COMMIT (or it was rolled back), so nothing of it is
// committed. It wraps driver.ErrTxDone and, as nothing was committed,
// driver.ErrTxAborted.
func errClaimEnded(op string, m *claimMark, err error) error {
	how := "rolled it back"
	if m.refused.Load() {
		how = "committed it, and the transaction guard turned that COMMIT into a rollback"
	}
	return fmt.Errorf("sqlitedriver: %s: %w: %w", op, driver.ErrTxDone,
		nothingCommitted{fmt.Errorf("the code run in the transaction %s; nothing of it is committed: %w", how, err)})
}

// nothingCommitted is an error that is driver.ErrTxAborted (nothing of the
// transaction is committed) without that error's text, which speaks of a
// failed statement.
type nothingCommitted struct{ error }

func (e nothingCommitted) Is(target error) bool { return target == driver.ErrTxAborted }
func (e nothingCommitted) Unwrap() error        { return e.error }

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
