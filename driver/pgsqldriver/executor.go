package pgsqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// dbtx is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// executor implements driver.Executor on the database or a transaction.
type executor struct {
	d    *Driver
	db   dbtx
	inTx bool
}

var _ driver.Executor = (*executor)(nil)

// mapErr translates PostgreSQL errors into driver errors, keeping the cause.
func mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if pgsql.SQLState(err) == pgsql.CodeLockNotAvailable {
		return fmt.Errorf("pgsqldriver: %s: %w: %w", op, driver.ErrLockTimeout, err)
	}
	if c := pgsql.SQLState(err); c == pgsql.CodeUndefinedTable || c == pgsql.CodeInvalidSchema {
		// Only idem's statements come here: its tables are missing.
		return fmt.Errorf("pgsqldriver: %s: %w: %w", op, driver.ErrNotMigrated, err)
	}
	if pgsql.SQLState(err) == pgsql.CodeInFailedSQLTransaction {
		return fmt.Errorf("pgsqldriver: %s: %w: %w", op, driver.ErrTxAborted, err)
	}
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("pgsqldriver: %s: %w: %w", op, driver.ErrTxDone, err)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("pgsqldriver: %s: %w", op, driver.ErrNotFound)
	}
	return fmt.Errorf("pgsqldriver: %s: %w", op, err)
}

// rowsAffected returns what res changed.
func rowsAffected(op string, res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, mapErr(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, mapErr(op, err)
	}
	return n, nil
}

// The shared statements cast their array parameters ($1::uuid[]); this
// driver binds them as PostgreSQL array literals in text, which every
// database/sql driver sends as they are (pgx's typed arrays and lib/pq's
// pq.Array are not needed).

// arrayLiteral writes the elements as a PostgreSQL array literal: each one
// double-quoted and escaped, nil as NULL.
func arrayLiteral[T any](elems []T, text func(T) (string, bool)) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		s, ok := text(e)
		if !ok {
			b.WriteString("NULL")
			continue
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func textArray(ss []string) string {
	return arrayLiteral(ss, func(s string) (string, bool) { return s, true })
}

// nullTextArray maps nil elements to NULL.
func nullTextArray(ss []*string) string {
	return arrayLiteral(ss, func(s *string) (string, bool) {
		if s == nil {
			return "", false
		}
		return *s, true
	})
}

func uuidArray(ids []uuid.UUID) string {
	return arrayLiteral(ids, func(id uuid.UUID) (string, bool) { return id.String(), true })
}

func intArray[T int64 | int16](vs []T) string {
	return arrayLiteral(vs, func(v T) (string, bool) { return strconv.FormatInt(int64(v), 10), true })
}

// byteaArray writes each element in bytea's hex format; nil is NULL.
func byteaArray(bs [][]byte) string {
	return arrayLiteral(bs, func(b []byte) (string, bool) {
		if b == nil {
			return "", false
		}
		return `\x` + fmt.Sprintf("%x", b), true
	})
}

// timeArray writes timestamptz values to the microsecond (PostgreSQL's
// precision), truncated as the drivers do for a single time. They are
// written in UTC (an offset's seconds, as in Europe/Amsterdam's +00:19:32
// until 1937, would not fit the layout), and years up to 0 with BC, as
// PostgreSQL reads them (it has no year 0: Go's year 0 is 1 BC).
func timeArray(ts []time.Time) string {
	return arrayLiteral(ts, func(t time.Time) (string, bool) {
		t = t.UTC().Truncate(time.Microsecond)
		if y := t.Year(); y <= 0 {
			return fmt.Sprintf("%04d", 1-y) + t.Format("-01-02T15:04:05.000000Z") + " BC", true
		}
		return t.Format("2006-01-02T15:04:05.000000Z"), true
	})
}

// nullTime maps NULL to the zero time.
func nullTime(t sql.NullTime) time.Time {
	if t.Valid {
		return t.Time
	}
	return time.Time{}
}
