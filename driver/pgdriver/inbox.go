package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem/driver"
)

// InboxInsert implements driver.InboxExecutor with one statement for the
// whole batch. The ids are deduplicated and sorted first, so concurrent
// batches lock their rows in the same order. A row inserted by a concurrent
// uncommitted transaction makes the statement wait on the primary key; once
// that transaction commits the row is skipped, once it rolls back the row
// is inserted here.
func (e *executor) InboxInsert(ctx context.Context, consumer string, ids []uuid.UUID, now time.Time) ([]uuid.UUID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	uniq := driver.SortedUniqueIDs(ids)
	arg := make([]pgtype.UUID, len(uniq))
	for i, id := range uniq {
		arg[i] = pgtype.UUID{Bytes: id, Valid: true}
	}
	rows, err := e.db.Query(ctx, e.d.expand(`INSERT INTO {{table}}processed_event (consumer_name, event_id, processed_at)
		SELECT $1, u.id, $3 FROM unnest($2::uuid[]) AS u(id) ORDER BY u.id
		ON CONFLICT (consumer_name, event_id) DO NOTHING
		RETURNING event_id`), consumer, arg, now)
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

// InboxDeleteBefore implements driver.InboxExecutor. It deletes by primary
// key from a bounded subquery so one statement never locks more than limit
// rows, and skips rows a concurrent cleaner holds. (Not by ctid as the other
// cleanup deletes do: ctid is only unique within one partition, and
// processed_event may be partitioned; see EnableInboxPartitioning.)
func (e *executor) InboxDeleteBefore(ctx context.Context, consumer string, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("pgdriver: inbox delete: limit %d must be positive", limit)
	}
	tag, err := e.db.Exec(ctx, e.d.expand(`DELETE FROM {{table}}processed_event WHERE (consumer_name, event_id) IN (
		SELECT consumer_name, event_id FROM {{table}}processed_event
		WHERE processed_at < $1 AND ($2::text = '' OR consumer_name = $2)
		ORDER BY processed_at LIMIT $3
		FOR UPDATE SKIP LOCKED)`), before, consumer, limit)
	if err != nil {
		return 0, mapErr("inbox delete", err)
	}
	return int(tag.RowsAffected()), nil
}

// InboxOldest implements driver.InboxExecutor.
func (e *executor) InboxOldest(ctx context.Context) (time.Time, bool, error) {
	var oldest *time.Time
	err := e.db.QueryRow(ctx, e.d.expand(`SELECT min(processed_at) FROM {{table}}processed_event`)).Scan(&oldest)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && oldest == nil) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, mapErr("inbox oldest", err)
	}
	return *oldest, true, nil
}
