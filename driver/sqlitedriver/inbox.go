package sqlitedriver

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
)

// InboxInsert implements driver.InboxExecutor with one statement for the
// whole batch: the ids travel as one JSON array expanded by json_each, so a
// batch of any size is a single statement with three bound parameters (no
// chunking, far from SQLITE_MAX_VARIABLE_NUMBER). SQLite serialises writers,
// so a concurrent duplicate waits for the write lock and then sees the
// committed row.
func (e *executor) InboxInsert(ctx context.Context, p *driver.InboxInsertParams) ([]uuid.UUID, error) {
	consumer, ids, now := p.Consumer, p.IDs, p.Now
	if len(ids) == 0 {
		return nil, nil
	}
	uniq := driver.SortedUniqueIDs(ids)
	var b strings.Builder
	b.Grow(len(uniq) * 39)
	b.WriteByte('[')
	for i, id := range uniq {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(id.String())
		b.WriteByte('"')
	}
	b.WriteByte(']')

	// "WHERE true" keeps the parser from reading ON CONFLICT as a join
	// constraint of the SELECT (see SQLite's UPSERT documentation).
	rows, err := e.db.QueryContext(ctx, e.d.expand(`INSERT INTO {{table}}processed_event (consumer_name, event_id, processed_at)
		SELECT ?1, j.value, ?2 FROM json_each(?3) AS j WHERE true
		ON CONFLICT (consumer_name, event_id) DO NOTHING
		RETURNING event_id`), consumer, micros(now), b.String())
	if err != nil {
		return nil, mapErr("inbox insert", err)
	}
	defer func() { _ = rows.Close() }()
	var inserted []uuid.UUID
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, mapErr("inbox insert", err)
		}
		id, err := uuid.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("sqlitedriver: inbox insert: stored event_id %q: %w", s, err)
		}
		inserted = append(inserted, id)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("inbox insert", err)
	}
	return inserted, nil
}

// InboxDeleteBefore implements driver.InboxExecutor: the rows after p.After
// in the order of the processed_at index (processed_at, then the primary
// key: consumer_name, event_id).
func (e *executor) InboxDeleteBefore(ctx context.Context, p *driver.InboxDeleteBeforeParams) (driver.DeleteResult[driver.InboxCursor], error) {
	if p.Limit <= 0 {
		return driver.DeleteResult[driver.InboxCursor]{Last: p.After}, fmt.Errorf("sqlitedriver: inbox delete: limit %d must be positive", p.Limit)
	}
	resume := !p.After.IsZero()
	args := []any{micros(p.Before), p.Consumer, p.Limit}
	if resume {
		args = append(args, micros(p.After.ProcessedAt), p.After.Consumer, p.After.EventID.String())
	}
	query := keysetSQL(`DELETE FROM {{table}}processed_event
		WHERE (consumer_name, event_id) IN (
			SELECT consumer_name, event_id FROM {{table}}processed_event
			WHERE processed_at < ?1 AND (?2 = '' OR consumer_name = ?2)`, `(processed_at, consumer_name, event_id) > (?4, ?5, ?6)`, `
			ORDER BY processed_at, consumer_name, event_id LIMIT ?3)
		RETURNING processed_at, consumer_name, event_id`, resume)
	n, last, err := retentionDelete(ctx, e, "inbox delete", query, args, p.After,
		func(r scanner) (driver.InboxCursor, error) {
			var c driver.InboxCursor
			var at int64
			var id string
			if err := r.Scan(&at, &c.Consumer, &id); err != nil {
				return c, err
			}
			c.ProcessedAt = fromMicros(at)
			var err error
			c.EventID, err = uuid.Parse(id)
			return c, err
		},
		func(a, b driver.InboxCursor) bool {
			return cmp.Or(a.ProcessedAt.Compare(b.ProcessedAt), cmp.Compare(a.Consumer, b.Consumer),
				bytes.Compare(a.EventID[:], b.EventID[:])) < 0
		})
	return driver.DeleteResult[driver.InboxCursor]{Deleted: n, Last: last}, err
}

// InboxOldest implements driver.InboxExecutor.
func (e *executor) InboxOldest(ctx context.Context) (time.Time, bool, error) {
	var oldest sql.NullInt64
	err := e.db.QueryRowContext(ctx, e.d.expand(`SELECT min(processed_at) FROM {{table}}processed_event`)).Scan(&oldest)
	if err != nil {
		return time.Time{}, false, mapErr("inbox oldest", err)
	}
	if !oldest.Valid {
		return time.Time{}, false, nil
	}
	return fromMicros(oldest.Int64), true, nil
}
