package sqlitedriver

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
)

const outboxColumns = `id, event_id, event_type, record_key, saga_id, payload, headers,
	occurred_at, created_at, attempts, last_error, next_attempt_at, parked_at, published_at`

// outboxInsertChunk bounds the rows of one INSERT statement (8 parameters a
// row, far below SQLite's limit of 32766).
const outboxInsertChunk = 500

// OutboxInsert implements driver.OutboxExecutor with one multi-row INSERT
// per 500 rows; the rows get their IDs in the order given. SQLite has no
// notification mechanism: the relay finds new rows by polling.
func (e *executor) OutboxInsert(ctx context.Context, rows []driver.OutboxRow) (int, error) {
	total := 0
	for len(rows) > 0 {
		chunk := rows[:min(len(rows), outboxInsertChunk)]
		rows = rows[len(chunk):]
		var (
			sb   strings.Builder
			args = make([]any, 0, 8*len(chunk))
		)
		// held (migration 007): the row is behind a parked row of its key.
		// Whether any row is parked is read once per statement (a probe of
		// outbox_blocked_idx, almost always empty); only then is each
		// row's key probed. The rows are inserted in the order given
		// (column9).
		sb.WriteString(e.d.expand(`INSERT INTO {{table}}outbox
			(event_id, event_type, record_key, saga_id, payload, headers, occurred_at, created_at, held)
			SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, v.column7, v.column8,
				CASE WHEN EXISTS (SELECT 1 FROM {{table}}outbox p
					WHERE p.published_at IS NULL
					  AND (p.parked_at IS NOT NULL OR p.next_attempt_at IS NOT NULL) AND p.parked_at IS NOT NULL)
				THEN EXISTS (SELECT 1 FROM {{table}}outbox b
					WHERE b.record_key = v.column3 AND b.published_at IS NULL
					  AND (b.parked_at IS NOT NULL OR b.next_attempt_at IS NOT NULL) AND b.parked_at IS NOT NULL)
				ELSE 0 END
			FROM (VALUES `))
		for i, r := range chunk {
			if i > 0 {
				sb.WriteString(", ")
			}
			fmt.Fprintf(&sb, "(?, ?, ?, ?, ?, ?, ?, ?, %d)", i)
			var saga, headers any
			if r.SagaID != "" {
				saga = r.SagaID
			}
			if r.Headers != nil {
				headers = string(r.Headers)
			}
			args = append(args, r.EventID.String(), r.EventType, r.Key, saga, nonNil(r.Payload), headers,
				micros(r.OccurredAt), micros(r.CreatedAt))
		}
		// WHERE true: an upsert's SELECT must end with a WHERE.
		sb.WriteString(") AS v WHERE true ORDER BY v.column9 ON CONFLICT (event_id) DO NOTHING")
		var run execer = e.db.raw
		if len(chunk) == 1 {
			// One event (outbox.EnqueueTx's usual call): always the same
			// text, worth keeping prepared.
			run = e.db
		}
		res, err := run.ExecContext(ctx, sb.String(), args...)
		if err != nil {
			return total, mapErr("outbox insert", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, mapErr("outbox insert", err)
		}
		total += int(n)
	}
	return total, nil
}

// outboxHeldKeysCTE lists the keys that have held rows (migration 007):
// a loose scan of outbox_held_idx, one probe per key (parked keys: few).
const outboxHeldKeysCTE = `hk(k) AS (
		SELECT (SELECT min(record_key) FROM {{table}}outbox WHERE published_at IS NULL AND held = 1)
		UNION ALL
		SELECT (SELECT min(record_key) FROM {{table}}outbox
			WHERE published_at IS NULL AND held = 1 AND record_key > hk.k)
		FROM hk WHERE hk.k IS NOT NULL)`

// outboxClaimSQL claims up to ?2 rows at ?1 (see OutboxClaimBatch): the
// first ?2 claimable rows of two sets merged by id (each is read in id
// order, and only as far as the merge needs).
//
//   - The rows not held: the walk of outbox_pending_idx in id order,
//     each row checked against the parked and backing-off rows of its key
//     (a probe of outbox_blocked_idx, almost always empty).
//   - The held rows (behind a parked row of their key, migration 007), key
//     by key: for each key, stop is its first blocking row (parked, or
//     backing off past ?1); its held rows from the first one up to
//     stop are claimable, none after. A key still blocked before its
//     first held row (its parked row is still parked) costs two probes
//     and gives none: its backlog is not read. Of an unblocked key, at
//     most ?2 rows are read (hi is the ?2-th).
const outboxClaimSQL = `WITH RECURSIVE ` + outboxHeldKeysCTE + `,
	runs(k, lo, stop) AS MATERIALIZED (
		SELECT k,
			(SELECT min(id) FROM {{table}}outbox WHERE published_at IS NULL AND held = 1 AND record_key = hk.k),
			coalesce((SELECT min(b.id) FROM {{table}}outbox b
				WHERE b.record_key = hk.k
				  AND b.published_at IS NULL AND (b.parked_at IS NOT NULL OR b.next_attempt_at IS NOT NULL)
				  AND (b.parked_at IS NOT NULL OR b.next_attempt_at > ?1)), 9223372036854775807)
		FROM hk WHERE hk.k IS NOT NULL),
	bounds(k, lo, hi) AS MATERIALIZED (
		SELECT k, lo, coalesce((SELECT id FROM {{table}}outbox
			WHERE published_at IS NULL AND held = 1 AND record_key = runs.k AND id >= runs.lo AND id < runs.stop
			ORDER BY id LIMIT 1 OFFSET ?2 - 1), runs.stop - 1)
		FROM runs WHERE runs.lo < runs.stop)
	SELECT ` + outboxColumns + ` FROM {{table}}outbox o
	WHERE o.published_at IS NULL AND o.held = 0
	  AND NOT EXISTS (SELECT 1 FROM {{table}}outbox b
		WHERE b.record_key = o.record_key AND b.id <= o.id
		  AND b.published_at IS NULL AND (b.parked_at IS NOT NULL OR b.next_attempt_at IS NOT NULL)
		  AND (b.parked_at IS NOT NULL OR b.next_attempt_at > ?1))
	UNION ALL
	SELECT ` + outboxColumns + ` FROM bounds JOIN {{table}}outbox o
		ON o.record_key = bounds.k AND o.id BETWEEN bounds.lo AND bounds.hi
	WHERE o.published_at IS NULL AND o.held = 1
	ORDER BY 1 LIMIT ?2`

// OutboxClaimBatch implements driver.OutboxExecutor (outboxClaimSQL): the
// pending rows in ID order through outbox_pending_idx, skipping the keys
// that are blocked (an earlier unpublished row of the key is parked or
// backing off: one probe of outbox_blocked_idx, almost always empty), and
// the rows held behind a parked row of their key through outbox_held_idx,
// whose keys still blocked cost a probe however long their backlog is.
// There are no lanes and no locks,
// which SQLite does not need with one writer: only one relay may claim per
// database (outbox.Relay enforces it with the lease outbox.RelayLockName of
// idem_lock). It stops reading at p.MaxBytes of payloads. It is a single
// SELECT, so it runs in a transaction
// or outside one alike; the relay runs it outside, so that it does not hold
// SQLite's single write lock while it publishes.
func (e *executor) OutboxClaimBatch(ctx context.Context, p *driver.OutboxClaimBatchParams) ([]driver.OutboxRow, error) {
	now, limit := p.Now, p.Limit
	if limit <= 0 {
		return nil, fmt.Errorf("sqlitedriver: outbox claim: limit %d must be positive", limit)
	}
	rows, err := e.db.QueryContext(ctx, e.d.expand(outboxClaimSQL), micros(now), limit)
	if err != nil {
		return nil, mapErr("outbox claim", err)
	}
	defer func() { _ = rows.Close() }()
	var (
		out   []driver.OutboxRow
		bytes int
	)
	for rows.Next() {
		r, err := scanOutboxRow(rows)
		if err != nil {
			return nil, mapErr("outbox claim", err)
		}
		// The rows come in ID order: those kept of each key are its
		// first ones. SQLite steps the statement row by row, so the rows
		// after the cut are never read.
		if bytes += len(r.Payload); p.MaxBytes > 0 && bytes > p.MaxBytes && len(out) > 0 {
			break
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("outbox claim", err)
	}
	return out, nil
}

func scanOutboxRow(rows scanner) (driver.OutboxRow, error) {
	var (
		r                          driver.OutboxRow
		id                         string
		saga, headers, lastErr     sql.NullString
		occurred, created          int64
		nextAttempt, parked, pubAt sql.NullInt64
	)
	err := rows.Scan(&r.ID, &id, &r.EventType, &r.Key, &saga, &r.Payload, &headers,
		&occurred, &created, &r.Attempts, &lastErr, &nextAttempt, &parked, &pubAt)
	if err != nil {
		return r, err
	}
	if r.EventID, err = uuid.Parse(id); err != nil {
		return r, fmt.Errorf("row %d: event_id %q: %w", r.ID, id, err)
	}
	r.SagaID = saga.String
	if headers.Valid {
		r.Headers = []byte(headers.String)
	}
	r.LastError = lastErr.String
	r.OccurredAt = fromMicros(occurred)
	r.CreatedAt = fromMicros(created)
	if nextAttempt.Valid {
		r.NextAttemptAt = fromMicros(nextAttempt.Int64)
	}
	if parked.Valid {
		r.ParkedAt = fromMicros(parked.Int64)
	}
	if pubAt.Valid {
		r.PublishedAt = fromMicros(pubAt.Int64)
	}
	return r, nil
}

// OutboxMarkPublished implements driver.OutboxExecutor.
func (e *executor) OutboxMarkPublished(ctx context.Context, p *driver.OutboxMarkPublishedParams) error {
	ids, at := p.IDs, p.At
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), outboxInsertChunk)]
		ids = ids[len(chunk):]
		args := make([]any, 0, len(chunk)+1)
		args = append(args, micros(at))
		for _, id := range chunk {
			args = append(args, id)
		}
		var run execer = e.db.raw
		if len(chunk) == 1 {
			// One event (a relay batch under light load): always the same
			// text, worth keeping prepared.
			run = e.db
		}
		_, err := run.ExecContext(ctx, e.d.expand(`UPDATE {{table}}outbox SET published_at = ?
			WHERE published_at IS NULL AND id IN (?`+strings.Repeat(", ?", len(chunk)-1)+`)`), args...)
		if err != nil {
			return mapErr("outbox mark published", err)
		}
	}
	return nil
}

// OutboxMarkFailed implements driver.OutboxExecutor.
func (e *executor) OutboxMarkFailed(ctx context.Context, p *driver.OutboxMarkFailedParams) error {
	id, errText, nextAttempt := p.ID, p.Error, p.NextAttempt
	res, err := e.db.ExecContext(ctx, e.d.expand(`UPDATE {{table}}outbox
		SET attempts = attempts + 1, last_error = ?2, next_attempt_at = ?3
		WHERE id = ?1 AND published_at IS NULL`), id, errText, micros(nextAttempt))
	if err != nil {
		return mapErr("outbox mark failed", err)
	}
	return outboxAffected("outbox mark failed", id, res)
}

// OutboxPark implements driver.OutboxExecutor.
func (e *executor) OutboxPark(ctx context.Context, p *driver.OutboxParkParams) error {
	id, errText, at := p.ID, p.Error, p.At
	res, err := e.db.ExecContext(ctx, e.d.expand(`UPDATE {{table}}outbox
		SET attempts = attempts + 1, last_error = ?2, parked_at = ?3
		WHERE id = ?1 AND published_at IS NULL`), id, errText, micros(at))
	if err != nil {
		return mapErr("outbox park", err)
	}
	return outboxAffected("outbox park", id, res)
}

func outboxAffected(op string, id int64, res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return mapErr(op, err)
	}
	if n == 0 {
		return fmt.Errorf("sqlitedriver: %s: row %d: %w", op, id, driver.ErrNotFound)
	}
	return nil
}

// OutboxDeletePublishedBefore implements driver.OutboxExecutor: the rows
// after p.After in the order of the published_at index (published_at, then
// the rowid, id).
func (e *executor) OutboxDeletePublishedBefore(ctx context.Context, p *driver.OutboxDeletePublishedBeforeParams) (driver.DeleteResult[driver.OutboxCursor], error) {
	if p.Limit <= 0 {
		return driver.DeleteResult[driver.OutboxCursor]{Last: p.After}, fmt.Errorf("sqlitedriver: outbox delete: limit %d must be positive", p.Limit)
	}
	resume := !p.After.IsZero()
	args := []any{micros(p.Before), p.Limit}
	if resume {
		args = append(args, micros(p.After.PublishedAt), p.After.ID)
	}
	query := keysetSQL(`DELETE FROM {{table}}outbox WHERE id IN (
		SELECT id FROM {{table}}outbox
		WHERE published_at IS NOT NULL AND published_at < ?1`, `(published_at, id) > (?3, ?4)`, `
		ORDER BY published_at, id LIMIT ?2)
		RETURNING published_at, id`, resume)
	n, last, err := retentionDelete(ctx, e, "outbox delete", query, args, p.After,
		func(r scanner) (driver.OutboxCursor, error) {
			var c driver.OutboxCursor
			var at int64
			err := r.Scan(&at, &c.ID)
			c.PublishedAt = fromMicros(at)
			return c, err
		},
		func(a, b driver.OutboxCursor) bool {
			return cmp.Or(a.PublishedAt.Compare(b.PublishedAt), cmp.Compare(a.ID, b.ID)) < 0
		})
	return driver.DeleteResult[driver.OutboxCursor]{Deleted: n, Last: last}, err
}

// outboxOldestSQL is the CreatedAt of the lowest-ID unpublished row: the
// first of outbox_pending_idx or the first held row of a key (migration
// 007), one probe per key with held rows.
const outboxOldestSQL = `WITH RECURSIVE ` + outboxHeldKeysCTE + `
	SELECT created_at FROM {{table}}outbox WHERE id = (SELECT min(m) FROM (
		SELECT (SELECT id FROM {{table}}outbox WHERE published_at IS NULL AND held = 0 ORDER BY id LIMIT 1) AS m
		UNION ALL
		SELECT (SELECT min(id) FROM {{table}}outbox WHERE published_at IS NULL AND held = 1 AND record_key = hk.k)
		FROM hk WHERE hk.k IS NOT NULL))`

// OutboxOldestUnpublished implements driver.OutboxExecutor
// (outboxOldestSQL): its cost does not depend on the backlog.
func (e *executor) OutboxOldestUnpublished(ctx context.Context) (time.Time, bool, error) {
	var oldest int64
	err := e.db.QueryRowContext(ctx, e.d.expand(outboxOldestSQL)).Scan(&oldest)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, mapErr("outbox oldest", err)
	}
	return fromMicros(oldest), true, nil
}

// outboxCountParkedSQL counts the parked unpublished rows through
// outbox_blocked_idx, the partial index of the unpublished rows that failed
// (almost always empty). SQLite uses a partial index only when the query's
// WHERE repeats each term of the index's own: hence the terms that look
// redundant.
const outboxCountParkedSQL = `SELECT count(*) FROM {{table}}outbox
	WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL)
	  AND parked_at IS NOT NULL`

// OutboxCountParked implements driver.OutboxExecutor (outboxCountParkedSQL).
func (e *executor) OutboxCountParked(ctx context.Context) (int, error) {
	var n int
	err := e.db.QueryRowContext(ctx, e.d.expand(outboxCountParkedSQL)).Scan(&n)
	if err != nil {
		return 0, mapErr("outbox count parked", err)
	}
	return n, nil
}

// outboxLastPublishedSQL is the latest publication time, the last entry
// of the partial index outbox_published_at_idx (whose term the WHERE
// repeats).
const outboxLastPublishedSQL = `SELECT max(published_at) FROM {{table}}outbox
	WHERE published_at IS NOT NULL`

// outboxLastParkedSQL is the latest park time of the parked unpublished
// rows, read through outbox_blocked_idx (see outboxCountParkedSQL).
const outboxLastParkedSQL = `SELECT max(parked_at) FROM {{table}}outbox
	WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL)
	  AND parked_at IS NOT NULL`

// OutboxLastPublished implements driver.OutboxExecutor
// (outboxLastPublishedSQL).
func (e *executor) OutboxLastPublished(ctx context.Context) (time.Time, bool, error) {
	return e.lastTime(ctx, "outbox last published", outboxLastPublishedSQL)
}

// OutboxLastParked implements driver.OutboxExecutor (outboxLastParkedSQL).
func (e *executor) OutboxLastParked(ctx context.Context) (time.Time, bool, error) {
	return e.lastTime(ctx, "outbox last parked", outboxLastParkedSQL)
}

// lastTime runs query, a max() of one time column, and returns false for
// its NULL.
func (e *executor) lastTime(ctx context.Context, op, query string) (time.Time, bool, error) {
	var last sql.NullInt64
	if err := e.db.QueryRowContext(ctx, e.d.expand(query)).Scan(&last); err != nil {
		return time.Time{}, false, mapErr(op, err)
	}
	if !last.Valid {
		return time.Time{}, false, nil
	}
	return fromMicros(last.Int64), true, nil
}

// OutboxRedrive implements driver.OutboxExecutor with one UPDATE of at most
// p.Limit rows, the earliest published first: the walk of the partial
// index on published_at, whose entries (published_at, id) leave it as they
// are redriven, so each call starts at the front and costs its batch, not
// the rows redriven before it (in ID order, each call stepped over all of
// them: 800,000 rows took 41 s). A key's rows were published in ID order,
// so they are redriven in ID order too (unless the clock stepped back
// between their publications).
func (e *executor) OutboxRedrive(ctx context.Context, p *driver.OutboxRedriveParams) (int, error) {
	switch {
	case p.Limit <= 0:
		return 0, fmt.Errorf("sqlitedriver: outbox redrive: limit %d must be positive", p.Limit)
	case p.PublishedBefore.IsZero():
		return 0, errors.New("sqlitedriver: outbox redrive: PublishedBefore must be set")
	}
	since := int64(math.MinInt64)
	if !p.PublishedSince.IsZero() {
		since = micros(p.PublishedSince)
	}
	args := []any{since, micros(p.PublishedBefore), p.Limit}
	keyFilter := ""
	if len(p.Keys) > 0 {
		// Numbered: a bare ? would take the number after the highest
		// one seen so far in the text (?2), not after ?3.
		marks := make([]string, len(p.Keys))
		for i, k := range p.Keys {
			args = append(args, k)
			marks[i] = "?" + strconv.Itoa(len(args))
		}
		keyFilter = " AND record_key IN (" + strings.Join(marks, ", ") + ")"
	}
	res, err := e.db.raw.ExecContext(ctx, e.d.expand(`UPDATE {{table}}outbox
		SET published_at = NULL, attempts = 0, last_error = NULL, next_attempt_at = NULL
		WHERE id IN (
			SELECT id FROM {{table}}outbox
			WHERE published_at IS NOT NULL AND published_at >= ?1 AND published_at < ?2`+keyFilter+`
			ORDER BY published_at, id LIMIT ?3)`), args...)
	if err != nil {
		return 0, mapErr("outbox redrive", err)
	}
	n, err := res.RowsAffected()
	return int(n), mapErr("outbox redrive", err)
}

// outboxRetryNowSQL makes at most ?2 unpublished rows backing off after ?1
// due at ?1. They are read through outbox_blocked_idx, whose terms the
// WHERE repeats (see outboxCountParkedSQL). SQLite has one writer at a
// time: no row is held by another transaction.
const outboxRetryNowSQL = `UPDATE {{table}}outbox SET next_attempt_at = ?1
	WHERE id IN (
		SELECT id FROM {{table}}outbox
		WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL)
		  AND parked_at IS NULL AND next_attempt_at > ?1
		LIMIT ?2)`

// OutboxRetryNow implements driver.OutboxExecutor (outboxRetryNowSQL).
func (e *executor) OutboxRetryNow(ctx context.Context, p *driver.OutboxRetryNowParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("sqlitedriver: outbox retry now: limit %d must be positive", p.Limit)
	}
	res, err := e.db.ExecContext(ctx, e.d.expand(outboxRetryNowSQL), micros(p.At), p.Limit)
	if err != nil {
		return 0, mapErr("outbox retry now", err)
	}
	n, err := res.RowsAffected()
	return int(n), mapErr("outbox retry now", err)
}

// outboxUnparkSQL clears the parked state, attempts and backoff of at most
// ?4 parked unpublished rows: those parked before ?1 (if not NULL), of the
// event IDs in the JSON array ?2 (if not NULL) and of the keys in the JSON
// array ?3 (if not NULL). One text whatever the selection (json_each, as
// InboxInsert), so it stays prepared. The parked rows are read through
// outbox_blocked_idx, whose terms the WHERE repeats (see
// outboxCountParkedSQL), in its order, key by key and each key's by id, up
// to ?4 rows: the rows a batch unparks leave the index, so each batch reads
// its own rows only (in id order, each batch read and sorted every parked
// row: 200,000 took 22 s).
const outboxUnparkSQL = `UPDATE {{table}}outbox
	SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
	WHERE id IN (
		SELECT id FROM {{table}}outbox
		WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL)
		  AND parked_at IS NOT NULL
		  AND (?1 IS NULL OR parked_at < ?1)
		  AND (?2 IS NULL OR event_id IN (SELECT value FROM json_each(?2)))
		  AND (?3 IS NULL OR record_key IN (SELECT value FROM json_each(?3)))
		ORDER BY record_key, id LIMIT ?4)`

// OutboxUnpark implements driver.OutboxExecutor (outboxUnparkSQL).
func (e *executor) OutboxUnpark(ctx context.Context, p *driver.OutboxUnparkParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("sqlitedriver: outbox unpark: limit %d must be positive", p.Limit)
	}
	var before, ids, keys any // NULL: no bound, every event, every key
	if !p.ParkedBefore.IsZero() {
		before = micros(p.ParkedBefore)
	}
	if len(p.EventIDs) > 0 {
		s := make([]string, len(p.EventIDs))
		for i, id := range p.EventIDs {
			s[i] = id.String()
		}
		ids = jsonStrings(s)
	}
	if len(p.Keys) > 0 {
		keys = jsonStrings(p.Keys)
	}
	res, err := e.db.ExecContext(ctx, e.d.expand(outboxUnparkSQL), before, ids, keys, p.Limit)
	if err != nil {
		return 0, mapErr("outbox unpark", err)
	}
	n, err := res.RowsAffected()
	return int(n), mapErr("outbox unpark", err)
}
