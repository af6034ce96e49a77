package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	// completeInsertSQL stores the completed record. It has no ON CONFLICT
	// on purpose: a key stored meanwhile by a writer that took no lock is
	// a unique violation, which aborts the transaction and skips the
	// COMMIT queued after it.
	completeInsertSQL  = pgsql.CompleteInsertSQL
	completeReplaceSQL = pgsql.CompleteReplaceSQL
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
// that LargeObjects runs a redundant BEGIN first (a server warning).
func (d *Driver) BeginClaim(ctx context.Context, p *driver.TxClaimParams) (pgx.Tx, *driver.TxClaimResult, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("pgdriver: begin: %w", err)
	}
	lock := d.recordLockKey(p.Scope, p.Key)
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
	tx := &claimTx{conn: conn}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == codeLockNotAvailable {
			return nil, &driver.TxClaimResult{}, nil
		}
		return nil, nil, mapErr("begin claim", err)
	}
	if !locked {
		if err := tx.Rollback(ctx); err != nil {
			return nil, nil, err
		}
		return nil, &driver.TxClaimResult{}, nil
	}
	return tx, &driver.TxClaimResult{Locked: true, Record: rec}, nil
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
	args := []any{p.Scope, p.Key, p.Fingerprint, p.Status, p.Headers, p.Body, p.CreatedAt, p.ExpiresAt}
	if p.Replace {
		// Rare (an expired or abandoned record): check the UPDATE took,
		// then commit.
		tag, err := ct.Exec(ctx, d.expand(completeReplaceSQL), args...)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("pgdriver: commit complete: the record came back to life: %w", driver.ErrLeaseLost)
		}
		if err != nil {
			_ = ct.Rollback(context.WithoutCancel(ctx))
			return mapErr("commit complete", err)
		}
		return ct.Commit(ctx)
	}
	b := &pgx.Batch{}
	b.Queue(d.expand(completeInsertSQL), args...)
	var committed bool
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		committed = tag.String() == "COMMIT"
		return nil
	})
	err := ct.conn.SendBatch(ctx, b).Close()
	if err == nil && committed {
		ct.release()
		return nil
	}
	_ = ct.Rollback(context.WithoutCancel(ctx))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation {
		return fmt.Errorf("pgdriver: commit complete: key stored by another writer: %w", driver.ErrLeaseLost)
	}
	if err == nil {
		err = pgx.ErrTxCommitRollback
	}
	return mapErr("commit complete", err)
}

// claimTx is the transaction of BeginClaim: pgx's own transaction type
// cannot be created around a BEGIN that was pipelined with other
// statements, so this one implements pgx.Tx on the acquired connection.
type claimTx struct {
	conn   *pgxpool.Conn
	closed bool
	nested int // savepoints created, for their names
}

var _ pgx.Tx = (*claimTx)(nil)

func (t *claimTx) release() {
	t.closed = true
	t.conn.Release()
}

func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	t.nested++
	sp := &savepointTx{top: t, name: "sp_" + strconv.Itoa(t.nested)}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

func (t *claimTx) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	if err != nil {
		_ = t.Rollback(context.WithoutCancel(ctx))
		return err
	}
	t.release()
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

func (t *claimTx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	_, err := t.conn.Exec(ctx, "ROLLBACK")
	if err != nil {
		// The connection's state is unknown: do not reuse it.
		_ = t.conn.Conn().Close(context.WithoutCancel(ctx))
	}
	t.release()
	return err
}

func (t *claimTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed {
		return 0, pgx.ErrTxClosed
	}
	return t.conn.CopyFrom(ctx, table, cols, src)
}

func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects runs on a pgx transaction opened on the same connection (its
// BEGIN is redundant: the server warns and stays in this transaction). Do
// not commit or roll back that one: this one ends it.
func (t *claimTx) LargeObjects() pgx.LargeObjects {
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
	return t.conn.Exec(ctx, sql, args...)
}

func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *claimTx) Conn() *pgx.Conn { return t.conn.Conn() }

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
	return s.top.CopyFrom(ctx, table, cols, src)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return s.top.SendBatch(ctx, b)
}

func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.top.LargeObjects() }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
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
	return s.top.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.top.Conn() }
