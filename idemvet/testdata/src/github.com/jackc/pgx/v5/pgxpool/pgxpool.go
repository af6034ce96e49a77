// Package pgxpool is a stub of pgx/v5/pgxpool for the idemvet tests.
package pgxpool

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type Pool struct{}

func (*Pool) Exec(ctx context.Context, sql string, args ...any) (pgx.CommandTag, error) {
	return pgx.CommandTag{}, nil
}
func (*Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) { return nil, nil }
func (*Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row        { return nil }
func (*Pool) Begin(ctx context.Context) (pgx.Tx, error)                            { return nil, nil }
func (*Pool) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error)         { return nil, nil }
