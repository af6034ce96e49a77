// Package pgxpool is a stub of pgx/v4/pgxpool for the idemvet tests.
package pgxpool

import (
	"context"

	"github.com/jackc/pgx/v4"
)

type Pool struct{}

func (*Pool) Exec(ctx context.Context, sql string, arguments ...interface{}) (pgx.CommandTag, error) {
	return nil, nil
}
func (*Pool) Query(ctx context.Context, sql string, args ...interface{}) (pgx.Rows, error) {
	return nil, nil
}
func (*Pool) QueryRow(ctx context.Context, sql string, args ...interface{}) pgx.Row { return nil }
func (*Pool) Begin(ctx context.Context) (pgx.Tx, error)                             { return nil, nil }
