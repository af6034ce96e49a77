package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// inboxPlainMin is the smallest batch (distinct ids) that InboxInsert
// records with a plain INSERT first. Smaller ones (Process records one id)
// take the ON CONFLICT path at once: a caller that records events one at a
// time in a long transaction then opens no subtransactions (see
// InboxInsert).
const inboxPlainMin = pgsql.InboxPlainMin

// InboxInsert implements driver.InboxExecutor with one INSERT for the whole
// batch (two when the batch holds an id recorded before). The ids are
// deduplicated and sorted first, so concurrent batches lock their rows in
// the same order. A row inserted by a concurrent uncommitted transaction
// makes the statement wait on the primary key; once that transaction
// commits the row is skipped, once it rolls back the row is inserted here.
//
// A batch of at least inboxPlainMin ids is first recorded with a plain
// INSERT (no ON CONFLICT, no RETURNING): in the common case, where every id
// is new, that is all, and it costs the server about a third less than
// INSERT ... ON CONFLICT DO NOTHING RETURNING, whose speculative insertion
// takes a lock, descends the primary key twice and writes a second WAL
// record (48 bytes) per row. If an id was recorded already, or is by a
// concurrent transaction that commits, the INSERT fails on the primary key
// (unique_violation, which the server logs as an ERROR) and the batch is
// recorded again with ON CONFLICT DO NOTHING RETURNING, which gives the new
// ids. In a transaction the plain INSERT runs inside a savepoint (SAVEPOINT,
// INSERT and RELEASE go in one round trip), so its failure leaves the
// caller's transaction usable. Each such call is one subtransaction of the
// caller's transaction until it ends; PostgreSQL tracks up to 64 of them
// per transaction cheaply, so record many batches in separate transactions,
// as package inbox does.
func (e *executor) InboxInsert(ctx context.Context, p *driver.InboxInsertParams) ([]uuid.UUID, error) {
	consumer, ids, now := p.Consumer, p.IDs, p.Now
	if len(ids) == 0 {
		return nil, nil
	}
	uniq := driver.SortedUniqueIDs(ids)
	arg := newUUIDArray(uniq)
	if len(uniq) < inboxPlainMin {
		return e.inboxInsertNew(ctx, consumer, arg, now, false)
	}
	all, err := e.inboxInsertAll(ctx, consumer, arg, now)
	if err != nil {
		return nil, err
	}
	if all {
		return uniq, nil
	}
	return e.inboxInsertNew(ctx, consumer, arg, now, e.inTx)
}

// inboxInsertAll records every id of arg with a plain INSERT and reports
// true, or reports false if one of them was recorded already; the batch is
// then not recorded at all (in a transaction, the savepoint it rolled back
// to is still to be released: see inboxInsertNew).
func (e *executor) inboxInsertAll(ctx context.Context, consumer string, arg uuidArray, now time.Time) (bool, error) {
	ins := e.d.expand(pgsql.InboxInsertAllSQL)
	var err error
	if e.inTx {
		b := &pgx.Batch{}
		b.Queue(pgsql.InboxSavepointSQL)
		b.Queue(ins, consumer, arg, now)
		b.Queue(pgsql.InboxReleaseSQL)
		err = e.db.SendBatch(ctx, b).Close()
	} else {
		// Outside a transaction the statement is one: a failure undoes
		// it all.
		_, err = e.db.Exec(ctx, ins, consumer, arg, now)
	}
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation:
		return false, nil
	default:
		return false, mapErr("inbox insert", err)
	}
}

// inboxInsertNew records the ids of arg that are not recorded yet with
// INSERT ... ON CONFLICT DO NOTHING RETURNING and returns them. If rollback
// is set, the savepoint of a failed inboxInsertAll is rolled back to and
// released first (one more round trip, on this rare path only: the
// transaction is in the failed state until then, where the INSERT could not
// even be prepared).
func (e *executor) inboxInsertNew(ctx context.Context, consumer string, arg uuidArray, now time.Time, rollback bool) ([]uuid.UUID, error) {
	if rollback {
		if _, err := e.db.Exec(ctx, `ROLLBACK TO SAVEPOINT idem_inbox_insert; RELEASE SAVEPOINT idem_inbox_insert`); err != nil {
			return nil, mapErr("inbox insert", err)
		}
	}
	rows, err := e.db.Query(ctx, e.d.expand(pgsql.InboxInsertNewSQL), consumer, arg, now)
	if err != nil {
		return nil, mapErr("inbox insert", err)
	}
	inserted, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (uuid.UUID, error) {
		var id pgtype.UUID
		err := row.Scan(&id)
		return uuid.UUID(id.Bytes), err
	})
	if err != nil {
		return nil, mapErr("inbox insert", err)
	}
	return inserted, nil
}

// InboxDeleteBefore implements driver.InboxExecutor. It picks at most limit
// expired rows after p.After, oldest first, through the processed_at index
// from p.After's time on (see pgsql.InboxDeleteBeforeSQL), locks them
// (skipping rows a concurrent cleaner holds), and deletes them through the
// primary key: the condition event_id = ANY(the picked ids) makes the
// delete probe the key (event_id first since migration 007) for those ids
// only. Without it the planner may join the picked rows against a
// sequential scan of the whole table, which reads every row, dead ones of
// the previous batches included, once per batch. (Not by ctid as the other
// cleanup deletes do: ctid is only unique within one partition, and
// processed_event may be partitioned; see EnableInboxPartitioning.)
func (e *executor) InboxDeleteBefore(ctx context.Context, p *driver.InboxDeleteBeforeParams) (driver.DeleteResult[driver.InboxCursor], error) {
	if p.Limit <= 0 {
		return driver.DeleteResult[driver.InboxCursor]{Last: p.After}, fmt.Errorf("pgdriver: inbox delete: limit %d must be positive", p.Limit)
	}
	res, err := inboxDelete(ctx, e.db, e.d.expand(pgsql.InboxDeleteBeforeSQL.Pick(!p.After.IsZero())), p)
	return res, mapErr("inbox delete", err)
}

// inboxDelete runs a retention delete of processed_event (sql is one of
// the variants of pgsql.InboxDeleteBeforeSQL or InboxDeleteDefaultSQL,
// expanded; the one for p.After) and reads its result.
func inboxDelete(ctx context.Context, db dbtx, sql string, p *driver.InboxDeleteBeforeParams) (driver.DeleteResult[driver.InboxCursor], error) {
	res := driver.DeleteResult[driver.InboxCursor]{Last: p.After}
	args := []any{p.Before, p.Consumer, p.Limit}
	if !p.After.IsZero() {
		args = append(args, p.After.ProcessedAt, p.After.Consumer, pgtype.UUID{Bytes: p.After.EventID, Valid: true})
	}
	var (
		n    int
		last driver.InboxCursor
		id   pgtype.UUID
	)
	err := db.QueryRow(ctx, sql, args...).Scan(&n, &last.ProcessedAt, &last.Consumer, &id)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, nil
	}
	if err != nil {
		return res, err
	}
	last.EventID = uuid.UUID(id.Bytes)
	return driver.DeleteResult[driver.InboxCursor]{Deleted: n, Last: last}, nil
}

// InboxOldest implements driver.InboxExecutor.
func (e *executor) InboxOldest(ctx context.Context) (time.Time, bool, error) {
	var oldest *time.Time
	err := e.db.QueryRow(ctx, e.d.expand(pgsql.InboxOldestSQL)).Scan(&oldest)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && oldest == nil) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, mapErr("inbox oldest", err)
	}
	return *oldest, true, nil
}
