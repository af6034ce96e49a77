package sqlitedriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/driver"
)

// rawdb runs the statements of prepared that are not prepared: *sql.DB,
// *sql.Tx, or nilTx.
type rawdb interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// execer runs a statement that returns no rows: rawdb, or prepared.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// executor implements driver.Executor on the database or a transaction.
type executor struct {
	d *Driver
	// db runs a statement prepared (see stmtCache). Every statement text
	// the driver sends through it is a constant, so the cache stays small;
	// texts built per call (IN lists, multi-row INSERTs) go to db.raw.
	db prepared
}

var _ driver.Executor = (*executor)(nil)

func mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlitedriver: %s: %w", op, driver.ErrNotFound)
	}
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("sqlitedriver: %s: %w: %w", op, driver.ErrTxDone, err)
	}
	if isTxRolledBack(err) {
		return fmt.Errorf("sqlitedriver: %s: %w: %w", op, errTxRolledBack, err)
	}
	if isNoTable(err) {
		// Only idem's statements come here: its tables are missing.
		return fmt.Errorf("sqlitedriver: %s: %w: %w", op, driver.ErrNotMigrated, err)
	}
	if isBusy(err) {
		// Another connection (another process) held the write lock for
		// the whole busy timeout: what PostgreSQL reports as a lock
		// timeout (idemhttp answers 409 in progress, not 503).
		return fmt.Errorf("sqlitedriver: %s: %w: %w", op, driver.ErrLockTimeout, err)
	}
	return fmt.Errorf("sqlitedriver: %s: %w", op, err)
}

// isConstraint reports whether err is SQLite's SQLITE_CONSTRAINT (any
// extended code).
func isConstraint(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 19
}

// isNoTable reports whether err is SQLite's "no such table" (SQLITE_ERROR,
// which has no code of its own for it).
func isNoTable(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 1 && strings.Contains(err.Error(), "no such table")
}

// isBusy reports whether err is SQLite's SQLITE_BUSY (any extended code).
func isBusy(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 5
}

// affected returns ErrLeaseLost when res changed no row.
func affected(op string, res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return mapErr(op, err)
	}
	if n == 0 {
		return fmt.Errorf("sqlitedriver: %s: %w", op, driver.ErrLeaseLost)
	}
	return nil
}
