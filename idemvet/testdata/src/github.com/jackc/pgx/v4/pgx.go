// Package pgx is a stub of pgx/v4 for the idemvet tests.
package pgx

import "context"

type CommandTag []byte

type Rows interface{ Close() }

type Row interface {
	Scan(dest ...interface{}) error
}

type Tx interface {
	Exec(ctx context.Context, sql string, arguments ...interface{}) (CommandTag, error)
	Query(ctx context.Context, sql string, args ...interface{}) (Rows, error)
	QueryRow(ctx context.Context, sql string, args ...interface{}) Row
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

type Conn struct{}

func (*Conn) Exec(ctx context.Context, sql string, arguments ...interface{}) (CommandTag, error) {
	return nil, nil
}
func (*Conn) Query(ctx context.Context, sql string, args ...interface{}) (Rows, error) {
	return nil, nil
}
func (*Conn) QueryRow(ctx context.Context, sql string, args ...interface{}) Row { return nil }
func (*Conn) Begin(ctx context.Context) (Tx, error)                             { return nil, nil }
