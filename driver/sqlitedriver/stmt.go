package sqlitedriver

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// maxStmts bounds the statements kept prepared: far more than the driver's
// constant statements, a safety net should a text built per call reach
// the cache.
const maxStmts = 128

// stmtRetryAfter is how long a statement whose preparation failed (a table
// not created yet, say) runs from its text before it is prepared again.
const stmtRetryAfter = 5 * time.Second

// stmtCache keeps the driver's statements prepared. SQLite compiles a
// statement each time it is run from its text, and on the request paths
// (the ModeTx claim and the completed record's INSERT, the inbox's and the
// outbox's inserts, the relay's claim) compiling costs about as much as
// running it.
//
// A statement is prepared on the database, never inside a transaction: with
// Open's single connection, a transaction holds the only connection, and
// preparing on the database from inside it would wait for itself. So a
// statement first asked for inside a transaction runs from its text there,
// and a goroutine prepares it as soon as the connection is free; a
// statement asked for outside a transaction is prepared at once. A
// transaction uses a prepared statement through (*sql.Tx).StmtContext, on
// the transaction's connection, one use at a time (see cachedStmt.busy).
// SQLite recompiles a prepared statement by itself when the schema changes.
type stmtCache struct {
	db     *sql.DB
	ctx    context.Context // cancelled by close
	cancel context.CancelFunc

	mu      sync.Mutex
	stmts   map[string]*cachedStmt
	pending map[string]bool      // asked for in a transaction, not prepared yet
	queue   []string             // pending, in order
	retryAt map[string]time.Time // failed preparations: when to try again
	running bool                 // a goroutine prepares the queue
	closed  bool
	wg      sync.WaitGroup
}

// cachedStmt is a prepared statement of the cache.
type cachedStmt struct {
	stmt *sql.Stmt
	// busy: a transaction uses stmt (it runs, or its rows are open).
	// database/sql gives every transaction on one connection the same
	// driver statement, which modernc.org/sqlite runs in place: a second
	// use while the first one's rows are open would fail (SQLite refuses to
	// bind a running statement) or, without arguments, step the first
	// one's cursor. A transaction used by several goroutines at once is
	// allowed, so a use that finds the statement busy runs from its text.
	busy atomic.Bool
}

func newStmtCache(db *sql.DB) *stmtCache {
	ctx, cancel := context.WithCancel(context.Background())
	return &stmtCache{
		db: db, ctx: ctx, cancel: cancel,
		stmts: map[string]*cachedStmt{}, pending: map[string]bool{}, retryAt: map[string]time.Time{},
	}
}

// get returns query's prepared statement, or nil when it is not prepared
// (yet). inTx says the caller holds a connection of the database (it runs
// in a transaction): the statement is then prepared in the background;
// otherwise it is prepared now.
func (c *stmtCache) get(ctx context.Context, query string, inTx bool) *cachedStmt {
	c.mu.Lock()
	if s := c.stmts[query]; s != nil || c.closed {
		c.mu.Unlock()
		return s
	}
	if at, ok := c.retryAt[query]; (ok && time.Now().Before(at)) || len(c.stmts)+len(c.pending) >= maxStmts {
		c.mu.Unlock()
		return nil
	}
	if inTx {
		if !c.pending[query] {
			c.pending[query] = true
			c.queue = append(c.queue, query)
		}
		if !c.running {
			c.running = true
			c.wg.Add(1)
			go c.prepareQueued()
		}
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	s, err := c.db.PrepareContext(ctx, query)
	return c.keep(ctx, query, s, err)
}

// keep records the outcome of preparing query and returns the statement to
// use (nil after a failure). A failure because ctx ended says nothing of
// the statement; any other makes it run from its text for stmtRetryAfter.
func (c *stmtCache) keep(ctx context.Context, query string, s *sql.Stmt, err error) *cachedStmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			c.retryAt[query] = time.Now().Add(stmtRetryAfter)
		}
		return nil
	}
	delete(c.retryAt, query)
	if old := c.stmts[query]; old != nil || c.closed {
		_ = s.Close() // prepared twice, or too late; nobody used it
		return old
	}
	cs := &cachedStmt{stmt: s}
	c.stmts[query] = cs
	return cs
}

// prepareQueued prepares the queued statements, one at a time, each once the
// connection is free.
func (c *stmtCache) prepareQueued() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		if len(c.queue) == 0 || c.closed {
			c.running = false
			c.mu.Unlock()
			return
		}
		query := c.queue[0]
		c.queue = c.queue[1:]
		delete(c.pending, query)
		c.mu.Unlock()
		s, err := c.db.PrepareContext(c.ctx, query)
		c.keep(c.ctx, query, s, err)
	}
}

// close stops the background preparation and closes the statements without
// waiting: (*sql.Stmt).Close waits for the calls in flight on the
// statement, and one of them may be waiting for the connection an open
// transaction holds, perhaps the transaction of the goroutine calling
// close. A call that meets a statement closed meanwhile runs its text.
func (c *stmtCache) close() {
	c.mu.Lock()
	c.closed = true
	stmts := c.stmts
	c.stmts = map[string]*cachedStmt{}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	if len(stmts) > 0 {
		go func() {
			for _, s := range stmts {
				_ = s.stmt.Close()
			}
		}()
	}
}

// stmtUnusable reports whether err is database/sql refusing to run a cached
// statement for a reason that is not the statement's: it was closed
// meanwhile (Close), or the transaction belongs to another *sql.DB than the
// one the statement was prepared on. The text runs instead.
func stmtUnusable(err error) bool {
	if err == nil {
		return false
	}
	switch err.Error() {
	case "sql: statement is closed", "sql: Tx.Stmt: statement from different database used":
		return true
	}
	return false
}

// prepared runs statements through the statement cache, on the database or
// in a transaction.
type prepared struct {
	c *stmtCache
	// raw is the database or the transaction: it runs a statement that is
	// not prepared (yet), and, used directly, one whose text is built per
	// call (not worth keeping).
	raw rawdb
	tx  *sql.Tx // set in a transaction
}

// onDB runs statements on the database; inTx runs them in tx. inTx(nil)
// runs none: each fails with errNilTx. (A nil *sql.Tx is a caller's
// transaction not threaded through; the cache would otherwise run the
// statements on the database, each committed on its own, and the others
// would panic.)
func (d *Driver) onDB() prepared { return prepared{c: d.stmts, raw: d.db} }
func (d *Driver) inTx(tx *sql.Tx) prepared {
	if tx == nil {
		return prepared{raw: nilTx{}}
	}
	return prepared{c: d.stmts, raw: tx, tx: tx}
}

// outsideTx reports whether p runs statements on the database, outside any
// transaction.
func (p prepared) outsideTx() bool { return p.tx == nil && p.c != nil }

// errNilTx is the error of every statement run in a nil *sql.Tx.
var errNilTx = errors.New("sqlitedriver: no transaction (a nil *sql.Tx)")

// nilTx is the raw of inTx(nil): it runs nothing.
type nilTx struct{}

func (nilTx) ExecContext(context.Context, string, ...any) (sql.Result, error) { return nil, errNilTx }
func (nilTx) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errNilTx
}

// acquire returns query's prepared statement for this executor and what to
// call once done with it (its rows closed), or nil: run the text.
func (p prepared) acquire(ctx context.Context, query string) (*sql.Stmt, func()) {
	if p.c == nil { // inTx(nil)
		return nil, nil
	}
	cs := p.c.get(ctx, query, p.tx != nil)
	if cs == nil {
		return nil, nil
	}
	if p.tx == nil {
		// database/sql gives each concurrent use a connection of its own.
		return cs.stmt, func() {}
	}
	if !cs.busy.CompareAndSwap(false, true) {
		return nil, nil
	}
	ts := p.tx.StmtContext(ctx, cs.stmt)
	return ts, func() {
		_ = ts.Close() // the transaction's handle only; cs.stmt stays
		cs.busy.Store(false)
	}
}

func (p prepared) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s, done := p.acquire(ctx, query); s != nil {
		res, err := s.ExecContext(ctx, args...)
		done()
		if !stmtUnusable(err) {
			return res, err
		}
	}
	return p.raw.ExecContext(ctx, query, args...)
}

func (p prepared) QueryContext(ctx context.Context, query string, args ...any) (*rows, error) {
	if s, done := p.acquire(ctx, query); s != nil {
		r, err := s.QueryContext(ctx, args...)
		if err == nil {
			return &rows{Rows: r, done: done}, nil
		}
		done()
		if !stmtUnusable(err) {
			return nil, err
		}
	}
	r, err := p.raw.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return &rows{Rows: r}, nil
}

// QueryRowContext is (*sql.DB).QueryRowContext through the cache: the
// returned row's Scan reports the query's error, or sql.ErrNoRows.
func (p prepared) QueryRowContext(ctx context.Context, query string, args ...any) *row {
	r, err := p.QueryContext(ctx, query, args...)
	return &row{rows: r, err: err}
}

// rows are the rows of a query run through the cache; a prepared
// statement goes back to the cache once they are closed, which happens at
// the latest when Next returns false.
type rows struct {
	*sql.Rows
	done func()
}

func (r *rows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.release() // database/sql has closed the rows
	return false
}

func (r *rows) Close() error {
	err := r.Rows.Close()
	r.release()
	return err
}

func (r *rows) release() {
	if done := r.done; done != nil {
		r.done = nil
		done()
	}
}

// row is the one row of QueryRowContext, with (*sql.Row).Scan's behaviour.
type row struct {
	rows *rows
	err  error
}

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer func() { _ = r.rows.Close() }()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	return r.rows.Close()
}
