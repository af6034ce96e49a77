package pgsqldriver

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// InboxInsert implements driver.InboxExecutor as pgdriver does (see its
// InboxInsert): a batch of at least pgsql.InboxPlainMin distinct ids is
// first recorded with a plain INSERT, in a savepoint when in a transaction,
// and recorded again with ON CONFLICT DO NOTHING RETURNING only when one of
// them was recorded before. The savepoint's statements are separate round
// trips here (database/sql has no pipeline).
func (e *executor) InboxInsert(ctx context.Context, p *driver.InboxInsertParams) ([]uuid.UUID, error) {
	if len(p.IDs) == 0 {
		return nil, nil
	}
	ids := driver.SortedUniqueIDs(p.IDs)
	arg := uuidArray(ids)
	if len(ids) < pgsql.InboxPlainMin {
		return e.inboxInsertNew(ctx, p.Consumer, arg, p.Now, false)
	}
	all, err := e.inboxInsertAll(ctx, p.Consumer, arg, p.Now)
	if err != nil {
		return nil, err
	}
	if all {
		return ids, nil
	}
	return e.inboxInsertNew(ctx, p.Consumer, arg, p.Now, e.inTx)
}

// inboxInsertAll records every id of arg with a plain INSERT and reports
// true, or reports false if one of them was recorded already (in a
// transaction, the savepoint is then still to be rolled back to).
func (e *executor) inboxInsertAll(ctx context.Context, consumer, arg string, now time.Time) (bool, error) {
	ins := e.d.expand(pgsql.InboxInsertAllSQL)
	var err error
	if e.inTx {
		if _, err := e.db.ExecContext(ctx, pgsql.InboxSavepointSQL); err != nil {
			return false, mapErr("inbox insert", err)
		}
		if _, err = e.db.ExecContext(ctx, ins, consumer, arg, now); err == nil {
			_, err = e.db.ExecContext(ctx, pgsql.InboxReleaseSQL)
		}
	} else {
		_, err = e.db.ExecContext(ctx, ins, consumer, arg, now)
	}
	switch {
	case err == nil:
		return true, nil
	case pgsql.SQLState(err) == pgsql.CodeUniqueViolation:
		return false, nil
	default:
		return false, mapErr("inbox insert", err)
	}
}

// inboxInsertNew records the ids of arg that are not recorded yet and
// returns them. If rollback is set, the savepoint of a failed
// inboxInsertAll is rolled back to and released first.
func (e *executor) inboxInsertNew(ctx context.Context, consumer, arg string, now time.Time, rollback bool) ([]uuid.UUID, error) {
	if rollback {
		for _, q := range []string{pgsql.InboxRollbackSavepointSQL, pgsql.InboxReleaseSQL} {
			if _, err := e.db.ExecContext(ctx, q); err != nil {
				return nil, mapErr("inbox insert", err)
			}
		}
	}
	rows, err := e.db.QueryContext(ctx, e.d.expand(pgsql.InboxInsertNewSQL), consumer, arg, now)
	if err != nil {
		return nil, mapErr("inbox insert", err)
	}
	inserted, err := collect(rows, func(s scanner) (uuid.UUID, error) {
		var id uuid.UUID
		return id, s.Scan(&id)
	})
	if err != nil {
		return nil, mapErr("inbox insert", err)
	}
	return inserted, nil
}

// InboxDeleteBefore implements driver.InboxExecutor (see
// pgsql.InboxDeleteBeforeSQL).
func (e *executor) InboxDeleteBefore(ctx context.Context, p *driver.InboxDeleteBeforeParams) (driver.DeleteResult[driver.InboxCursor], error) {
	res := driver.DeleteResult[driver.InboxCursor]{Last: p.After}
	if p.Limit <= 0 {
		return res, fmt.Errorf("pgsqldriver: inbox delete: limit %d must be positive", p.Limit)
	}
	args := []any{p.Before, p.Consumer, p.Limit}
	if !p.After.IsZero() {
		args = append(args, p.After.ProcessedAt, p.After.Consumer, p.After.EventID.String())
	}
	var last driver.InboxCursor
	n, err := e.retentionDelete(ctx, "inbox delete", pgsql.InboxDeleteBeforeSQL.Pick(!p.After.IsZero()), args,
		&last.ProcessedAt, &last.Consumer, &last.EventID)
	if err != nil || n == 0 {
		return res, err
	}
	return driver.DeleteResult[driver.InboxCursor]{Deleted: n, Last: last}, nil
}

// InboxPartitioned reports whether processed_event is partitioned (by
// pgdriver's EnableInboxPartitioning: pgsqldriver has no partition mode).
// The cleaner of package cleanup refuses to sweep such a table with row
// DELETEs, as it does with pgdriver without cleanup.Config.PartitionedInbox.
func (d *Driver) InboxPartitioned(ctx context.Context) (bool, error) {
	var ok bool
	if err := d.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass($1))`,
		d.expand("{{table}}processed_event")).Scan(&ok); err != nil {
		return false, mapErr("inbox partitioned", err)
	}
	return ok, nil
}

// InboxOldest implements driver.InboxExecutor.
func (e *executor) InboxOldest(ctx context.Context) (time.Time, bool, error) {
	var oldest sql.NullTime
	if err := e.db.QueryRowContext(ctx, e.d.expand(pgsql.InboxOldestSQL)).Scan(&oldest); err != nil {
		return time.Time{}, false, mapErr("inbox oldest", err)
	}
	return oldest.Time, oldest.Valid, nil
}

// collect scans every row of rows with scan and closes rows.
func collect[T any](rows *sql.Rows, scan func(scanner) (T, error)) ([]T, error) {
	defer func() { _ = rows.Close() }()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
