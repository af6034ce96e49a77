package uniq

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SavepointTx runs fn in a savepoint of the PostgreSQL transaction tx (pgx
// starts a nested transaction as SAVEPOINT): when fn fails, or panics, only
// its statements are rolled back and tx stays usable; when it succeeds the
// savepoint is released and its writes become part of tx. fn's error is
// returned unwrapped, so Is still recognises it.
func SavepointTx(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) (err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("uniq: savepoint: %w", err)
	}
	// The rollback must run even when ctx was cancelled: the outer
	// transaction decides what happens next, not a dead context.
	rollback := func() error {
		if rbErr := sp.Rollback(context.WithoutCancel(ctx)); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
			return fmt.Errorf("uniq: rollback to savepoint: %w", rbErr)
		}
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			_ = rollback()
			panic(p)
		}
	}()
	if err := fn(sp); err != nil {
		if rbErr := rollback(); rbErr != nil {
			return errors.Join(err, rbErr)
		}
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("uniq: release savepoint: %w", err)
	}
	return nil
}
