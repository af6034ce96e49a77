package sqlitedriver

import (
	"context"
	"database/sql"
	"sync"
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
// the transaction's connection. SQLite recompiles a prepared statement by
// itself when the schema changes.
type stmtCache struct {
	db     *sql.DB
	ctx    context.Context // cancelled by close
	cancel context.CancelFunc

	mu      sync.Mutex
	stmts   map[string]*sql.Stmt
	pending map[string]bool      // asked for in a transaction, not prepared yet
	queue   []string             // pending, in order
	retryAt map[string]time.Time // failed preparations: when to try again
	running bool                 // a goroutine prepares the queue
	closed  bool
	wg      sync.WaitGroup
}

func newStmtCache(db *sql.DB) *stmtCache {
	ctx, cancel := context.WithCancel(context.Background())
	return &stmtCache{
		db: db, ctx: ctx, cancel: cancel,
		stmts: map[string]*sql.Stmt{}, pending: map[string]bool{}, retryAt: map[string]time.Time{},
	}
}

// get returns query's prepared statement, or nil when it is not prepared
// (yet). inTx says the caller holds a connection of the database (it runs
// in a transaction): the statement is then prepared in the background;
// otherwise it is prepared now.
func (c *stmtCache) get(ctx context.Context, query string, inTx bool) *sql.Stmt {
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
func (c *stmtCache) keep(ctx context.Context, query string, s *sql.Stmt, err error) *sql.Stmt {
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
		_ = s.Close() // prepared twice, or too late
		return old
	}
	c.stmts[query] = s
	return s
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

// close stops the background preparation and closes the statements.
func (c *stmtCache) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for q, s := range c.stmts {
		_ = s.Close()
		delete(c.stmts, q)
	}
}

// prepared runs statements through the statement cache, on the database or
// in a transaction.
type prepared struct {
	c *stmtCache
	// raw is the database or the transaction: it runs a statement that is
	// not prepared (yet), and, used directly, one whose text is built per
	// call (not worth keeping).
	raw dbtx
	tx  *sql.Tx // set in a transaction
}

// onDB runs statements on the database; inTx runs them in tx.
func (d *Driver) onDB() prepared           { return prepared{c: d.stmts, raw: d.db} }
func (d *Driver) inTx(tx *sql.Tx) prepared { return prepared{c: d.stmts, raw: tx, tx: tx} }

// stmt returns query's prepared statement for this executor, or nil.
func (p prepared) stmt(ctx context.Context, query string) *sql.Stmt {
	s := p.c.get(ctx, query, p.tx != nil)
	if s == nil || p.tx == nil {
		return s
	}
	return p.tx.StmtContext(ctx, s)
}

func (p prepared) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s := p.stmt(ctx, query); s != nil {
		return s.ExecContext(ctx, args...)
	}
	return p.raw.ExecContext(ctx, query, args...)
}

func (p prepared) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if s := p.stmt(ctx, query); s != nil {
		return s.QueryContext(ctx, args...)
	}
	return p.raw.QueryContext(ctx, query, args...)
}

func (p prepared) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if s := p.stmt(ctx, query); s != nil {
		return s.QueryRowContext(ctx, args...)
	}
	return p.raw.QueryRowContext(ctx, query, args...)
}
