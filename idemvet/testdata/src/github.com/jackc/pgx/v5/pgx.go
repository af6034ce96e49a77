// Package pgx is a stub of pgx/v5 for the idemvet tests.
package pgx

import "context"

type CommandTag struct{}

func (CommandTag) RowsAffected() int64 { return 0 }

type Rows interface{ Close() }

type Row interface{ Scan(dest ...any) error }

type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Begin(ctx context.Context) (Tx, error)
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

type TxOptions struct{}

func BeginFunc(ctx context.Context, db interface {
	Begin(ctx context.Context) (Tx, error)
}, fn func(Tx) error) error {
	return nil
}

func BeginTxFunc(ctx context.Context, db interface {
	BeginTx(ctx context.Context, txOptions TxOptions) (Tx, error)
}, txOptions TxOptions, fn func(Tx) error) error {
	return nil
}

type Conn struct{}

func (*Conn) Exec(ctx context.Context, sql string, args ...any) (CommandTag, error) {
	return CommandTag{}, nil
}
func (*Conn) Query(ctx context.Context, sql string, args ...any) (Rows, error) { return nil, nil }
func (*Conn) QueryRow(ctx context.Context, sql string, args ...any) Row        { return nil }
func (*Conn) Begin(ctx context.Context) (Tx, error)                            { return nil, nil }
func (*Conn) BeginTx(ctx context.Context, o TxOptions) (Tx, error)             { return nil, nil }
