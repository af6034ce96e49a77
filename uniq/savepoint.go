package uniq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// SavepointTx runs fn in a savepoint of the PostgreSQL transaction tx (pgx
// starts a nested transaction as SAVEPOINT): when fn fails, or panics, only
// its statements are rolled back and tx stays usable; when it succeeds the
// savepoint is released and its writes become part of tx. fn's error is
// returned unwrapped, so Is still recognises it.
func SavepointTx(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	fnErr, spErr := pgSavepoint(ctx, tx, fn)
	return joinSavepoint(fnErr, spErr)
}

// SavepointSQLTx is SavepointTx for a database/sql transaction, on
// PostgreSQL (the pgx stdlib driver, lib/pq) and SQLite (modernc.org/sqlite),
// which both have SAVEPOINT, RELEASE SAVEPOINT and ROLLBACK TO SAVEPOINT: it
// runs fn between SAVEPOINT and RELEASE SAVEPOINT of a savepoint of its own
// (a fresh name at each call, so calls may nest); when fn fails, or panics,
// ROLLBACK TO SAVEPOINT undoes fn's statements only, the savepoint is
// released and tx stays usable. fn receives tx itself: database/sql has no
// nested transaction. fn's error is returned unwrapped, so Is still
// recognises it. fn must close any *sql.Rows it opened before it returns.
func SavepointSQLTx(ctx context.Context, tx *sql.Tx, fn func(*sql.Tx) error) error {
	fnErr, spErr := sqlSavepoint(ctx, tx, fn)
	return joinSavepoint(fnErr, spErr)
}

// joinSavepoint is the error of a savepoint helper: fn's error unwrapped,
// joined with the savepoint's own failure if any.
func joinSavepoint(fnErr, spErr error) error {
	if spErr == nil {
		return fnErr
	}
	if fnErr == nil {
		return spErr
	}
	return errors.Join(fnErr, spErr)
}

// errNilTx is the error of the savepoint helpers, and of CreateOrGetTx and
// CreateOrGetSQLTx, given a nil transaction, on which they would panic.
var errNilTx = errors.New("uniq: savepoint: nil transaction (pass the transaction to run in, such as idemhttp.TxFromContext's, checking that it found one)")

// pgSavepoint runs fn in a savepoint of tx. fnErr is fn's error; spErr is a
// failure of the savepoint itself (taking, releasing or rolling back to it),
// after which tx may not be usable.
func pgSavepoint(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) (fnErr, spErr error) {
	if tx == nil {
		return nil, errNilTx
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("uniq: savepoint: %w", err)
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
		return err, rollback()
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("uniq: release savepoint: %w", err)
	}
	return nil, nil
}

// savepointSeq names the savepoints of SavepointSQLTx: unique in the
// process, so that nested calls never refer to each other's savepoint.
var savepointSeq atomic.Uint64

// sqlSavepoint is pgSavepoint for a *sql.Tx.
func sqlSavepoint(ctx context.Context, tx *sql.Tx, fn func(*sql.Tx) error) (fnErr, spErr error) {
	if tx == nil {
		return nil, errNilTx
	}
	name := "uniq_sp_" + strconv.FormatUint(savepointSeq.Add(1), 10)
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
		return nil, fmt.Errorf("uniq: savepoint: %w", err)
	}
	// As in pgSavepoint, the rollback outlives a cancelled ctx. ROLLBACK TO
	// keeps the savepoint on both PostgreSQL and SQLite: RELEASE drops it.
	// A transaction already ended (sql.ErrTxDone: its own context was
	// cancelled) has nothing left to roll back.
	rollback := func() error {
		rbCtx := context.WithoutCancel(ctx)
		for _, q := range []string{"ROLLBACK TO SAVEPOINT ", "RELEASE SAVEPOINT "} {
			if _, err := tx.ExecContext(rbCtx, q+name); err != nil {
				if errors.Is(err, sql.ErrTxDone) {
					return nil
				}
				return fmt.Errorf("uniq: rollback to savepoint: %w", err)
			}
		}
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			_ = rollback()
			panic(p)
		}
	}()
	if err := fn(tx); err != nil {
		return err, rollback()
	}
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+name); err != nil {
		return nil, fmt.Errorf("uniq: release savepoint: %w", err)
	}
	return nil, nil
}
