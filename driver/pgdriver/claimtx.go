package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

var _ driver.TxClaimer[pgx.Tx] = (*Driver)(nil)

// codeUniqueViolation is PostgreSQL's unique_violation.
const codeUniqueViolation = pgsql.CodeUniqueViolation

// SQL of the ModeTx fast path (TxClaimer).
const (
	// claimTryLockSQL takes the key's transaction-scoped advisory lock if
	// it is free; claimLockSQL waits for it (bounded by the lock_timeout
	// set before it).
	claimTryLockSQL = pgsql.ClaimTryLockSQL
	claimLockSQL    = pgsql.ClaimLockSQL
	// claimReplayOrLockSQL and unlockSQL: the uncontended path
	// (replayOrLock).
	claimReplayOrLockSQL = pgsql.ClaimReplayOrLockSQL
	unlockSQL            = pgsql.UnlockSQL
	// completeInsertSQL stores the completed record. It has no ON CONFLICT
	// on purpose: a key stored meanwhile by a writer that took no lock is
	// a unique violation, which aborts the transaction and skips the
	// COMMIT queued after it.
	completeInsertSQL  = pgsql.CompleteInsertSQL
	completeReplaceSQL = pgsql.CompleteReplaceSQL
	// isolationAndPIDSQL reads the session's default isolation level (the
	// level of the uncontended claim's implicit transactions) and the
	// server process that runs the statement: through a pooler it is not
	// the process ID the connection was given at its start.
	isolationAndPIDSQL = `SELECT current_setting('default_transaction_isolation'), pg_backend_pid()`
)

// recordLockKey is the advisory lock of (scope, key) in this driver's table: a
// 64-bit FNV-1a hash. Two keys that collide only serialise each other.
func (d *Driver) recordLockKey(scope, key string) int64 {
	return d.names.RecordLockKey(scope, key)
}

// BeginClaim implements driver.TxClaimer in one round trip: BEGIN, the
// key's advisory lock (pg_try_advisory_xact_lock, or, with p.Wait, a
// lock_timeout and pg_advisory_xact_lock) and the read of the record, in
// one pipeline. The read is a statement of its own, after the lock's, so
// under READ COMMITTED it sees what the lock's previous holder committed.
// The transaction is a pgx.Tx of this package, on a connection of the
// pool, with the same behaviour as pgx's (Begin makes savepoints) except
// that LargeObjects runs a redundant BEGIN first (a server warning), and
// that its own Commit and Rollback are refused: it is ended by
// CommitComplete or Driver.Rollback (Driver.Commit), so that a handler
// cannot commit its effect without the record.
//
// Without p.Wait and with p.Now set (idemhttp's uncontended path), it is
// replayOrLock instead: no BEGIN, a completed live record is returned
// without any lock, and otherwise the key's session-level
// pg_try_advisory_lock is taken, released with the COMMIT or ROLLBACK.
// Not behind a pooler in transaction mode (Config.TransactionPooling,
// or detected by the first claim), where the next statement may run in
// another server session than the lock's: there every claim takes the
// transaction-scoped lock, and one that finds it taken (without p.Wait,
// with p.Now) still answers a completed record live at p.Now, read in the
// same pipeline.
func (d *Driver) BeginClaim(ctx context.Context, p *driver.TxClaimParams) (pgx.Tx, *driver.TxClaimResult, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("pgdriver: begin: %w", err)
	}
	if err := d.iso.Check(ctx, "pgdriver", func(ctx context.Context) (level string, err error) {
		// The first claim also tells whether the pool goes through a
		// pooler: see Config.TransactionPooling.
		var pid uint32
		err = conn.QueryRow(ctx, isolationAndPIDSQL).Scan(&level, &pid)
		if err == nil && pid != conn.Conn().PgConn().PID() {
			d.pooled.Store(true)
		}
		return level, err
	}); err != nil {
		conn.Release()
		return nil, nil, err
	}
	lock := d.recordLockKey(p.Scope, p.Key)
	if p.Wait <= 0 && !p.Now.IsZero() && !d.pooled.Load() {
		return d.replayOrLock(ctx, conn, lock, p)
	}
	var (
		locked bool
		rec    *driver.Record
	)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	if p.Wait > 0 {
		// The contended path only: the lock_timeout is set for the wait and
		// put back, so the handler's statements keep the session's.
		b.Queue(pgsql.SaveLockTimeoutSQL)
		b.Queue(pgsql.SetLockTimeoutSQL, strconv.FormatInt(max(p.Wait.Milliseconds(), 1), 10)+"ms")
		b.Queue(claimLockSQL, lock).Exec(func(pgconn.CommandTag) error { locked = true; return nil })
		b.Queue(pgsql.RestoreLockTimeoutSQL)
	} else {
		b.Queue(claimTryLockSQL, lock).QueryRow(func(row pgx.Row) error { return row.Scan(&locked) })
	}
	b.Queue(d.expand(claimReadSQL), p.Scope, p.Key).QueryRow(func(row pgx.Row) error {
		r, err := scanRecord(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		rec = r
		return err
	})
	tx := &claimTx{conn: conn, begun: true}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		_ = tx.rollback(context.WithoutCancel(ctx))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == codeLockNotAvailable {
			return nil, &driver.TxClaimResult{}, nil
		}
		return nil, nil, mapErr("begin claim", err)
	}
	if !locked {
		if err := tx.rollback(ctx); err != nil {
			return nil, nil, err
		}
		if p.Wait <= 0 && !p.Now.IsZero() && rec != nil && rec.State == driver.StateCompleted && rec.ExpiresAt.After(p.Now) {
			// The lock is taken (behind a pooler, by a concurrent
			// replay of the same completed request): the record read
			// in the same pipeline is answered, as replayOrLock does.
			return nil, &driver.TxClaimResult{Record: rec}, nil
		}
		return nil, &driver.TxClaimResult{}, nil
	}
	return tx, &driver.TxClaimResult{Locked: true, Record: rec}, nil
}

// replayOrLock is BeginClaim's uncontended path, in one round trip and no
// transaction: claimReplayOrLockSQL, then the read of the record, in one
// pipeline. The read is a statement of its own, so it sees what a previous
// holder of the lock committed before the lock was taken. A completed live
// record is returned unlocked (the caller replays it: nothing to roll
// back). Otherwise the key's session-level lock is held by the returned
// transaction, whose BEGIN goes out with its first statement; it is
// released in the same round trip as the COMMIT or ROLLBACK, and a
// connection whose lock could not be released is closed, never returned to
// the pool.
func (d *Driver) replayOrLock(ctx context.Context, conn *pgxpool.Conn, lock int64, p *driver.TxClaimParams) (pgx.Tx, *driver.TxClaimResult, error) {
	var (
		locked pgtype.Bool
		rec    *driver.Record
	)
	b := &pgx.Batch{}
	b.Queue(d.expand(claimReplayOrLockSQL), p.Scope, p.Key, lock, p.Now).QueryRow(func(row pgx.Row) error {
		return row.Scan(&locked)
	})
	b.Queue(d.expand(claimReadSQL), p.Scope, p.Key).QueryRow(func(row pgx.Row) error {
		r, err := scanRecord(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		rec = r
		return err
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		// Whether the lock was taken is unknown: the connection goes.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
		return nil, nil, mapErr("begin claim", err)
	}
	switch {
	case locked.Valid && locked.Bool:
		return &claimTx{conn: conn, lock: lock, sessionLock: true, pooled: &d.pooled}, &driver.TxClaimResult{Locked: true, Record: rec}, nil
	case !locked.Valid && rec != nil && rec.State == driver.StateCompleted && rec.ExpiresAt.After(p.Now):
		conn.Release()
		return nil, &driver.TxClaimResult{Record: rec}, nil
	}
	// The lock is held by another transaction, or the completed record
	// went (expired and deleted) between the two statements: not locked.
	conn.Release()
	return nil, &driver.TxClaimResult{}, nil
}

// CommitComplete implements driver.TxClaimer: the INSERT of the completed
// record and COMMIT in one pipeline. tx must come from BeginClaim.
func (d *Driver) CommitComplete(ctx context.Context, tx pgx.Tx, p *driver.TxCompleteParams) error {
	ct, ok := tx.(*claimTx)
	if !ok || ct.closed {
		if tx != nil {
			_ = tx.Rollback(ctx)
		}
		return errors.New("pgdriver: commit complete: not an open transaction of BeginClaim")
	}
	if ct.begun && ct.conn.Conn().PgConn().TxStatus() == 'E' {
		// A statement of the caller failed: PostgreSQL aborted the
		// transaction, and the record's INSERT would fail with 25P02.
		_ = ct.rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("pgdriver: commit complete: %w", driver.ErrTxAborted)
	}
	args := []any{p.Scope, p.Key, p.Fingerprint, p.Status, p.Headers, p.Body, p.CreatedAt, p.ExpiresAt}
	if p.Replace {
		// Rare (an expired or abandoned record): check the UPDATE took,
		// then commit.
		tag, err := ct.Exec(ctx, d.expand(completeReplaceSQL), args...)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("pgdriver: commit complete: the record came back to life: %w", driver.ErrLeaseLost)
		}
		if err != nil {
			_ = ct.rollback(context.WithoutCancel(ctx))
			if errors.Is(err, driver.ErrLeaseLost) {
				return err
			}
			// The COMMIT was not sent: nothing was committed.
			return fmt.Errorf("%w: %w", driver.ErrNotCommitted, mapErr("commit complete", err))
		}
		if err := ct.commit(ctx); err != nil {
			if pgsql.IsConstraintClass(err) {
				// A deferred constraint failed at COMMIT.
				return fmt.Errorf("pgdriver: commit complete: %w: %w", driver.ErrTxAborted, err)
			}
			if pgsql.Refused(err) {
				return fmt.Errorf("%w: %w", driver.ErrNotCommitted, mapErr("commit complete", err))
			}
			return mapErr("commit complete", err)
		}
		return nil
	}
	b := &pgx.Batch{}
	if !ct.begun {
		// The handler wrote nothing. An explicit transaction all the same:
		// in the implicit one of a pipeline the unlock below would run
		// before the INSERT commits, and a waiting duplicate would not
		// see the record.
		b.Queue("BEGIN")
		ct.begun = true
	}
	b.Queue(d.expand(completeInsertSQL), args...)
	var committed bool
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		committed = tag.String() == "COMMIT"
		return nil
	})
	if ct.sessionLock {
		b.Queue(unlockSQL, ct.lock)
	}
	err := ct.conn.SendBatch(ctx, b).Close()
	if committed {
		// The server answered the COMMIT: committed, whatever became of
		// the unlock after it. When its answer did not come (the
		// connection lost right after the COMMIT's), the session may
		// still hold the lock: the connection is closed, never pooled.
		ct.sessionLock = err != nil
		ct.release()
		return nil
	}
	_ = ct.rollback(context.WithoutCancel(ctx))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation && pgErr.ConstraintName == d.names.RecordKeyConstraint() {
		// The record's INSERT, not a deferred constraint of the handler's
		// tables checked by the COMMIT (the handler's own failure: running
		// it again would fail the same way).
		return fmt.Errorf("pgdriver: commit complete: key stored by another writer: %w", driver.ErrLeaseLost)
	}
	recordsOwn := errors.As(err, &pgErr) && pgErr.TableName == d.names.Name+"idempotency_record"
	if !committed && pgsql.IsConstraintClass(err) && !recordsOwn {
		// A deferred constraint of the handler's tables failed at COMMIT:
		// nothing was committed.
		return fmt.Errorf("pgdriver: commit complete: %w: %w", driver.ErrTxAborted, err)
	}
	if !committed && pgsql.Refused(err) {
		// The server answered the record's INSERT (the COMMIT after it
		// in the pipeline did not run) or the COMMIT with an error: the
		// transaction was rolled back, the outcome is known.
		return fmt.Errorf("%w: %w", driver.ErrNotCommitted, mapErr("commit complete", err))
	}
	if err == nil {
		err = pgx.ErrTxCommitRollback
	}
	return mapErr("commit complete", err)
}

// claimTx is the transaction of BeginClaim: pgx's own transaction type
// cannot be created around a BEGIN that was pipelined with other
// statements, so this one implements pgx.Tx on the acquired connection.
//
// On the uncontended path (replayOrLock) the transaction holds the key's
// session-level lock and has not begun: its BEGIN goes out in the same
// round trip as its first statement, and the lock is released in the same
// round trip as its COMMIT or ROLLBACK. A connection that may still hold
// the lock is closed, never returned to the pool.
type claimTx struct {
	conn   *pgxpool.Conn
	closed bool
	nested int // savepoints created, for their names
	// begun: BEGIN was sent (and succeeded).
	begun bool
	// sessionLock: the connection holds the session-level lock lock.
	sessionLock bool
	lock        int64
	// pooled is the driver's: set when the unlock finds that the session
	// does not hold the lock (a pooler moved the connection to another
	// server session), so that later claims keep their locks in their
	// transactions.
	pooled *atomic.Bool
}

var _ pgx.Tx = (*claimTx)(nil)

// release returns the connection to the pool, or closes it when it may
// still hold the key's session-level lock.
func (t *claimTx) release() {
	t.closed = true
	if t.sessionLock {
		_ = t.conn.Conn().Close(context.Background())
	}
	t.conn.Release()
}

// begin sends the BEGIN a statement cannot be pipelined with.
func (t *claimTx) begin(ctx context.Context) error {
	if t.begun {
		return nil
	}
	if _, err := t.conn.Exec(ctx, "BEGIN"); err != nil {
		return err
	}
	t.begun = true
	return nil
}

// withBegin returns a batch of BEGIN followed by the statement, when BEGIN
// is still to be sent and the statement can share its round trip (plain
// arguments: no QueryExecMode or QueryRewriter, which only Exec and Query
// interpret); otherwise it sends BEGIN alone and returns nil.
func (t *claimTx) withBegin(ctx context.Context, sql string, args []any) (*pgx.Batch, error) {
	if t.begun {
		return nil, nil
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryRewriter, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return nil, t.begin(ctx)
		}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sql, args...)
	return b, nil
}

// end sends the COMMIT or ROLLBACK (when begun) and the unlock (when the
// lock is held) in one round trip, and releases the connection. They go as
// one simple-protocol query: nothing to prepare, which an aborted
// transaction would refuse.
func (t *claimTx) end(ctx context.Context, verb string) (pgconn.CommandTag, error) {
	var stmts []string
	if t.begun {
		stmts = append(stmts, verb)
	}
	if t.sessionLock {
		stmts = append(stmts, "SELECT pg_advisory_unlock("+strconv.FormatInt(t.lock, 10)+")")
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	if len(stmts) > 0 {
		var res []*pgconn.Result
		res, err = t.conn.Conn().PgConn().Exec(ctx, strings.Join(stmts, "; ")).ReadAll()
		if err == nil && t.begun && len(res) > 0 {
			tag = res[0].CommandTag
		}
		if err != nil && verb == "COMMIT" && t.begun && len(res) > 0 && res[0].Err == nil && res[0].CommandTag.String() == "COMMIT" {
			// The server answered the COMMIT, then the unlock's answer
			// did not come (the session ended between the two, or the
			// connection broke after the COMMIT's answer): committed.
			// The session may still hold the lock: closed, never pooled.
			_ = t.conn.Conn().Close(context.WithoutCancel(ctx))
			t.release()
			return res[0].CommandTag, nil
		}
		if err == nil && t.sessionLock && t.pooled != nil && unlockRefused(res) {
			// The lock was taken in another server session than this
			// statement's: a pooler that detection missed. The lock stays
			// with that session; the driver's next claims take
			// transaction-scoped locks.
			t.pooled.Store(true)
		}
	}
	if err != nil {
		// The connection's state is unknown: do not reuse it.
		_ = t.conn.Conn().Close(context.WithoutCancel(ctx))
	} else {
		t.sessionLock = false
	}
	t.release()
	return tag, err
}

// unlockRefused reports whether the last result of end's statements, the
// unlock's, is false: the session did not hold the lock.
func unlockRefused(res []*pgconn.Result) bool {
	if len(res) == 0 {
		return false
	}
	last := res[len(res)-1]
	return len(last.Rows) == 1 && len(last.Rows[0]) == 1 && string(last.Rows[0][0]) == "f"
}

func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	t.nested++
	sp := &savepointTx{top: t, name: "sp_" + strconv.Itoa(t.nested)}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

// errTxOwned refuses Commit and Rollback of a transaction of BeginClaim:
// its owner (idemhttp) ends it, with the completed record (CommitComplete)
// or with Driver.Rollback. A handler that committed it would leave its
// effect without the record, and every retry would apply it again.
var errTxOwned = errors.New("pgdriver: idemhttp owns this transaction: the handler must not commit or roll it back " +
	"(a savepoint, tx.Begin, undoes part of it)")

// Commit is refused (errTxOwned): the transaction is ended by
// CommitComplete or Driver.Rollback. Savepoints (Begin) commit as usual.
func (t *claimTx) Commit(context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	return errTxOwned
}

// Rollback is refused (errTxOwned), like Commit: a handler's deferred
// Rollback does nothing, and the owner ends the transaction.
func (t *claimTx) Rollback(context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	return errTxOwned
}

// commit ends the transaction with COMMIT.
func (t *claimTx) commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	tag, err := t.end(ctx, "COMMIT")
	if err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// rollback ends the transaction with ROLLBACK.
func (t *claimTx) rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	_, err := t.end(ctx, "ROLLBACK")
	return err
}

func (t *claimTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed {
		return 0, pgx.ErrTxClosed
	}
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, cols, src)
}

func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed {
		return &failedBatch{err: pgx.ErrTxClosed}
	}
	if t.begun {
		return t.conn.SendBatch(ctx, b)
	}
	// BEGIN goes first in the same round trip; its result is skipped, and
	// the transaction counts as begun once it ran. (pgx sends nothing of a
	// batch with a statement it cannot prepare or encode, BEGIN included.)
	nb := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: "BEGIN"}}, b.QueuedQueries...)}
	return &skipFirst{BatchResults: t.conn.SendBatch(ctx, nb), tx: t}
}

// LargeObjects runs on a pgx transaction opened on the same connection (its
// BEGIN is redundant: the server warns and stays in this transaction). Do
// not commit or roll back that one: this one ends it.
func (t *claimTx) LargeObjects() pgx.LargeObjects {
	if t.closed {
		return pgx.LargeObjects{}
	}
	if err := t.begin(context.Background()); err != nil {
		return pgx.LargeObjects{}
	}
	inner, err := t.conn.Conn().Begin(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	return inner.LargeObjects()
}

func (t *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Conn().Prepare(ctx, name, sql)
}

func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if len(args) == 0 && !t.begun {
		// pgx runs a statement without arguments with the simple
		// protocol, whose text may hold several statements (a batch would
		// prepare it and refuse them): BEGIN goes in front of the text.
		return t.execSimpleWithBegin(ctx, sql)
	}
	b, err := t.withBegin(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if b == nil {
		return t.conn.Exec(ctx, sql, args...)
	}
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgconn.CommandTag{}, err
	}
	t.begun = true
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// execSimpleWithBegin runs "BEGIN;" and sql as one simple-protocol query
// and returns the command tag of sql's last statement, as pgx's Exec does.
func (t *claimTx) execSimpleWithBegin(ctx context.Context, sql string) (pgconn.CommandTag, error) {
	mrr := t.conn.Conn().PgConn().Exec(ctx, "BEGIN;"+sql)
	var tag pgconn.CommandTag
	for n := 0; mrr.NextResult(); n++ {
		rtag, err := mrr.ResultReader().Close()
		if n == 0 && err == nil {
			t.begun = true
		}
		if n > 0 {
			tag = rtag
		}
	}
	if err := mrr.Close(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return tag, nil
}

func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	b, err := t.withBegin(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	if b == nil {
		return t.conn.Query(ctx, sql, args...)
	}
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	t.begun = true
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &queryRow{rows: rows, err: err}
}

// Conn returns the connection; BEGIN is sent first, so that statements
// run on it directly are inside the transaction. Once the transaction has
// ended the connection is back in the pool (or closed): Conn returns nil.
func (t *claimTx) Conn() *pgx.Conn {
	if t.closed {
		return nil
	}
	if err := t.begin(context.Background()); err != nil {
		// Statements sent on the connection would run outside any
		// transaction: the connection goes (the transaction fails).
		_ = t.conn.Conn().Close(context.Background())
	}
	return t.conn.Conn()
}

// savepointTx is a nested transaction of a claimTx.
type savepointTx struct {
	top    *claimTx
	name   string
	closed bool
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.top.Begin(ctx)
}

func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed || s.top.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.top.conn.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed || s.top.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.top.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}

func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if s.closed {
		return 0, pgx.ErrTxClosed
	}
	return s.top.CopyFrom(ctx, table, cols, src)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if s.closed {
		return &failedBatch{err: pgx.ErrTxClosed}
	}
	return s.top.SendBatch(ctx, b)
}

func (s *savepointTx) LargeObjects() pgx.LargeObjects {
	if s.closed {
		return pgx.LargeObjects{}
	}
	return s.top.LargeObjects()
}

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.top.Prepare(ctx, name, sql)
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if s.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return s.top.Exec(ctx, sql, args...)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.top.Query(ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.closed {
		return &queryRow{err: pgx.ErrTxClosed}
	}
	return s.top.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.top.Conn() }

// skipFirst is the BatchResults of a batch whose first statement (BEGIN) the
// caller did not queue; tx counts as begun once that BEGIN ran.
type skipFirst struct {
	pgx.BatchResults
	tx      *claimTx
	skipped bool
	err     error
}

func (b *skipFirst) skip() error {
	if !b.skipped {
		b.skipped = true
		if _, b.err = b.BatchResults.Exec(); b.err == nil {
			b.tx.begun = true
		}
	}
	return b.err
}

func (b *skipFirst) Close() error {
	_ = b.skip()
	return b.BatchResults.Close()
}

// failedBatch is the BatchResults of a batch that was not sent.
type failedBatch struct{ err error }

func (b *failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b *failedBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b *failedBatch) QueryRow() pgx.Row                { return &queryRow{err: b.err} }
func (b *failedBatch) Close() error                     { return b.err }
func (b *failedBatch) Tx() pgx.Tx                       { return nil }

func (b *skipFirst) Exec() (pgconn.CommandTag, error) {
	if err := b.skip(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return b.BatchResults.Exec()
}

func (b *skipFirst) Query() (pgx.Rows, error) {
	if err := b.skip(); err != nil {
		return nil, err
	}
	return b.BatchResults.Query()
}

func (b *skipFirst) QueryRow() pgx.Row {
	if err := b.skip(); err != nil {
		return &queryRow{err: err}
	}
	return b.BatchResults.QueryRow()
}

// batchRows are the rows of a query sent in a batch after BEGIN: closing
// them closes the batch.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

// Next closes the batch after the last row, as pgx closes rows: a caller
// that reads them to the end need not call Close before its next
// statement.
func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if !r.closed {
		r.closed = true
		r.closeErr = r.br.Close()
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// queryRow is QueryRow over Query, as pgx's own: the first row, or
// pgx.ErrNoRows.
type queryRow struct {
	rows pgx.Rows
	err  error
}

func (r *queryRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		r.rows.Close()
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
