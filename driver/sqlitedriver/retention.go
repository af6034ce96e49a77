package sqlitedriver

import (
	"context"
	"fmt"
)

// Retention deletes (see driver.DeleteResult). Every table of the driver is
// WITHOUT ROWID but outbox, whose id is the rowid: each retention index
// (the time column) therefore holds the rest of the cursor's key after the
// time, and a batch resumes with one range read of that index from the
// cursor on, in the cursor's order. SQLite removes a deleted row's index
// entries at once, so it never read the deleted entries again as
// PostgreSQL did; the cursor keeps the drivers alike.

// keysetSQL returns a retention delete's statement for the zero cursor
// (resume false: after is left out) or after one.
func keysetSQL(first, after, rest string, resume bool) string {
	if resume {
		return first + " AND " + after + rest
	}
	return first + rest
}

// retentionDelete runs a DELETE ... RETURNING the deleted rows' keys (one
// batch of a retention delete), reading each key with scan, and returns
// how many rows it deleted and the greatest key by less (after when none).
func retentionDelete[C any](ctx context.Context, e *executor, op, query string, args []any, after C,
	scan func(scanner) (C, error), less func(a, b C) bool,
) (int, C, error) {
	rows, err := e.db.QueryContext(ctx, e.d.expand(query), args...)
	if err != nil {
		return 0, after, mapErr(op, err)
	}
	defer func() { _ = rows.Close() }()
	n, last := 0, after
	for rows.Next() {
		k, err := scan(rows)
		if err != nil {
			return 0, after, fmt.Errorf("sqlitedriver: %s: %w", op, err)
		}
		if n == 0 || less(last, k) {
			last = k
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return 0, after, mapErr(op, err)
	}
	return n, last, nil
}
