package pgdriver

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// dbtx is what pgxpool.Pool and pgx.Tx have in common.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// executor implements driver.Executor on a pool or on a transaction.
type executor struct {
	d    *Driver
	db   dbtx
	inTx bool
}

var _ driver.Executor = (*executor)(nil)

// SQLSTATE codes idem maps to driver errors.
const (
	codeLockNotAvailable = pgsql.CodeLockNotAvailable
)

// mapErr translates PostgreSQL errors into driver errors, keeping the cause.
func mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeLockNotAvailable {
		return fmt.Errorf("pgdriver: %s: %w: %w", op, driver.ErrLockTimeout, err)
	}
	if errors.As(err, &pgErr) && (pgErr.Code == pgsql.CodeUndefinedTable || pgErr.Code == pgsql.CodeInvalidSchema) {
		// Only idem's statements come here: its tables are missing.
		return fmt.Errorf("pgdriver: %s: %w: %w", op, driver.ErrNotMigrated, err)
	}
	if errors.As(err, &pgErr) && pgErr.Code == pgsql.CodeInFailedSQLTransaction || errors.Is(err, pgx.ErrTxCommitRollback) {
		return fmt.Errorf("pgdriver: %s: %w: %w", op, driver.ErrTxAborted, err)
	}
	if errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("pgdriver: %s: %w: %w", op, driver.ErrTxDone, err)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("pgdriver: %s: %w", op, driver.ErrNotFound)
	}
	return fmt.Errorf("pgdriver: %s: %w", op, err)
}
