package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
)

// lazyTx is a pgx.Tx on a pooled connection whose BEGIN may travel with its
// first statement.
type lazyTx struct {
	conn    *pgxpool.Conn // nil once committed or rolled back
	begun   bool          // BEGIN was sent
	pending *driver.RecordCompleteParams
	claim   *driver.RecordClaimParams // "single": the record to insert at commit
}

var _ pgx.Tx = (*lazyTx)(nil)

var errLazyUnsupported = errors.New("pipedriver: not supported by the prototype's lazy transaction")

// begin sends BEGIN on its own, for statements that cannot carry it.
func (t *lazyTx) begin(ctx context.Context) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	if t.begun {
		return nil
	}
	t.begun = true
	_, err := t.conn.Exec(ctx, "begin")
	return err
}

// SendBatch implements pgx.Tx: the first batch carries BEGIN.
func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.conn == nil {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	if !t.begun {
		t.begun = true
		nb := &pgx.Batch{}
		nb.Queue("begin")
		nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
		b = nb
	}
	return t.conn.SendBatch(ctx, b)
}

// Exec implements pgx.Tx.
func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.conn.Exec(ctx, sql, args...)
}

// Query implements pgx.Tx.
func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

// QueryRow implements pgx.Tx.
func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.begin(ctx); err != nil {
		return errRow{err}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

// CopyFrom implements pgx.Tx.
func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, cols, src)
}

// Prepare implements pgx.Tx.
func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.conn == nil {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Conn().Prepare(ctx, name, sql)
}

// Begin implements pgx.Tx; nested transactions are not prototyped.
func (t *lazyTx) Begin(context.Context) (pgx.Tx, error) { return nil, errLazyUnsupported }

// LargeObjects implements pgx.Tx; not prototyped.
func (t *lazyTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

// Conn implements pgx.Tx.
func (t *lazyTx) Conn() *pgx.Conn {
	if t.conn == nil {
		return nil
	}
	return t.conn.Conn()
}

// Commit implements pgx.Tx (without a pending outcome).
func (t *lazyTx) Commit(ctx context.Context) error { return t.commit(ctx, nil) }

// commit sends the pending outcome, if any, and COMMIT in one pipeline.
func (t *lazyTx) commit(ctx context.Context, d *pipeDriver) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	defer t.release(ctx)
	if !t.begun {
		return nil // nothing was sent
	}
	b := &pgx.Batch{}
	switch p, c := t.pending, t.claim; {
	case d == nil || p == nil:
	case c != nil:
		b.Queue(d.insertSQL, c.Scope, c.Key, c.Fingerprint, p.Status, p.Headers, p.Body, c.Now, c.ExpiresAt)
	default:
		b.Queue(d.completeSQL, p.Scope, p.Key, p.LeaseToken, p.Status, p.Headers, p.Body)
	}
	var tag pgconn.CommandTag
	b.Queue("commit").Exec(func(ct pgconn.CommandTag) error {
		tag = ct
		return nil
	})
	if err := t.conn.SendBatch(ctx, b).Close(); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "22P02" {
			return fmt.Errorf("%w: %w", driver.ErrLeaseLost, err)
		}
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Rollback implements pgx.Tx.
func (t *lazyTx) Rollback(ctx context.Context) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	t.release(ctx)
	return nil
}

// release ends whatever transaction is open on the connection (none after
// a peeked replay) and returns it to the pool; a connection that cannot be
// cleaned is closed.
func (t *lazyTx) release(ctx context.Context) {
	c := t.conn
	t.conn = nil
	if c.Conn().PgConn().TxStatus() != 'I' {
		if _, err := c.Exec(ctx, "rollback"); err != nil {
			_ = c.Conn().Close(ctx)
		}
	}
	c.Release()
}

// errRow is a pgx.Row that returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
