package pgsqldriver

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
	"github.com/idemkit/idem/internal/dberr"
)

// OutboxInsert implements driver.OutboxExecutor with pgdriver's statement
// (see pgsql.OutboxInsertSQL): one INSERT of the rows in their order, which
// also notifies OutboxChannel() (pg_notify) when a row was new.
func (e *executor) OutboxInsert(ctx context.Context, rows []driver.OutboxRow) (int, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = rows[i].EventID.String()
	}
	a := pgsql.NewOutboxInsertArrays(rows)
	names, err := e.d.outboxNames(ctx, e.db)
	if err != nil {
		return 0, err
	}
	var inserted, notified int
	err = e.db.QueryRowContext(ctx, e.d.expand(pgsql.OutboxInsertSQL),
		textArray(ids), textArray(a.Types), textArray(a.Keys), nullTextArray(a.Sagas), byteaArray(a.Payloads),
		nullTextArray(a.Headers), timeArray(a.Occurred), timeArray(a.Created), e.d.notifyChannel(names),
	).Scan(&inserted, &notified)
	if err != nil {
		return 0, mapErr("outbox insert", err)
	}
	return inserted, nil
}

// OutboxClaimBatch implements driver.OutboxExecutor with pgdriver's lanes
// (see pgdriver's OutboxClaimBatch and migrations 006_outbox_lanes.sql and
// 008_outbox_pending.sql): the lanes with pending rows are locked with
// pg_try_advisory_xact_lock (the same locks as pgdriver's, so relays of
// both drivers share a database), then their rows are read by a second
// statement, whose snapshot is taken after the locks are held.
func (e *executor) OutboxClaimBatch(ctx context.Context, p *driver.OutboxClaimBatchParams) ([]driver.OutboxRow, error) {
	if !e.inTx {
		return nil, errors.New("pgsqldriver: outbox claim: must run in a transaction held until the rows are marked (use UnwrapExecutor)")
	}
	if p.Limit <= 0 {
		return nil, fmt.Errorf("pgsqldriver: outbox claim: limit %d must be positive", p.Limit)
	}
	if err := e.d.iso.Check(ctx, "pgsqldriver: outbox claim", func(ctx context.Context) (level string, err error) {
		return level, e.db.QueryRowContext(ctx, pgsql.TxIsolationSQL).Scan(&level)
	}); err != nil {
		return nil, err
	}
	if ms, ok := pgsql.HoldTimeoutMillis(p.HoldTimeout); ok {
		if _, err := e.db.ExecContext(ctx, pgsql.OutboxHoldTimeoutSQL, ms); err != nil {
			return nil, mapErr("outbox claim", err)
		}
	}
	var bitmap, readOnly string
	if err := e.db.QueryRowContext(ctx, pgsql.OutboxBitmapOffReadOnlySQL).Scan(&bitmap, &readOnly); err != nil {
		return nil, mapErr("outbox claim", err)
	}
	if readOnly == "on" {
		// The marks would fail: publishing now would publish the same
		// events again at every round while the database stays
		// read-only (as pgdriver, which reads what the server reported).
		return nil, fmt.Errorf("pgsqldriver: outbox claim: %w; nothing claimed or published", dberr.ReadOnlySession("transaction_read_only"))
	}
	names, err := e.d.outboxNames(ctx, e.db)
	if err != nil {
		return nil, err
	}
	var legacy any // NULL, or Names.LegacyOutboxLockClass
	if c := e.d.names.LegacyOutboxLockClass(); c != nil {
		legacy = *c
	}
	start := rand.IntN(pgsql.OutboxLanes)
	tried := []int16{}
	var out []driver.OutboxRow
	// As pgdriver: lanes whose every key is blocked yield no row, and the
	// next lanes are tried.
	for len(out) == 0 && len(tried) < pgsql.OutboxLanes {
		n := min(pgsql.LanesPerClaim, p.Limit)
		if len(tried) > 0 {
			n = pgsql.LanesPerClaim
		}
		rows, err := e.db.QueryContext(ctx, e.d.expand(pgsql.OutboxLanesSQL),
			start, names.OutboxLockClass(), n, intArray(tried), legacy)
		if err != nil {
			return nil, mapErr("outbox claim: lanes", err)
		}
		lanes, err := collect(rows, func(s scanner) (int16, error) {
			var lane int16
			return lane, s.Scan(&lane)
		})
		if err != nil {
			return nil, mapErr("outbox claim: lanes", err)
		}
		if len(lanes) == 0 {
			break
		}
		read, bounded := e.d.read.Statement(p.MaxBytes)
		args := []any{intArray(lanes), p.Now, p.Limit}
		if bounded {
			args = append(args, p.MaxBytes)
		}
		rows, err = e.db.QueryContext(ctx, e.d.expand(read), args...)
		if err != nil {
			return nil, mapErr("outbox claim", err)
		}
		// As pgdriver: kept up to p.MaxBytes (pgsql.ReadBound).
		var scanErr error
		out = pgsql.Cut(&e.d.read, p.MaxBytes, func() (driver.OutboxRow, int, bool) {
			if scanErr != nil || !rows.Next() {
				return driver.OutboxRow{}, 0, false
			}
			var r driver.OutboxRow
			r, scanErr = scanOutboxRow(rows)
			return r, len(r.Payload), scanErr == nil
		})
		if err := errors.Join(scanErr, rows.Err(), rows.Close()); err != nil {
			return nil, mapErr("outbox claim", err)
		}
		tried = append(tried, lanes...)
	}
	if _, err := e.db.ExecContext(ctx, pgsql.OutboxBitmapDefaultSQL); err != nil {
		return nil, mapErr("outbox claim", err)
	}
	slices.SortFunc(out, func(a, b driver.OutboxRow) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// scanOutboxRow scans the pgsql.OutboxColumns of row.
func scanOutboxRow(row scanner) (driver.OutboxRow, error) {
	var (
		r                          driver.OutboxRow
		saga, lastErr              sql.NullString
		nextAttempt, parked, pubAt sql.NullTime
	)
	err := row.Scan(&r.ID, &r.EventID, &r.EventType, &r.Key, &saga, &r.Payload, &r.Headers,
		&r.OccurredAt, &r.CreatedAt, &r.Attempts, &lastErr, &nextAttempt, &parked, &pubAt)
	if err != nil {
		return r, err
	}
	r.SagaID = saga.String
	r.LastError = lastErr.String
	r.NextAttemptAt = nullTime(nextAttempt)
	r.ParkedAt = nullTime(parked)
	r.PublishedAt = nullTime(pubAt)
	return r, nil
}

// OutboxMarkPublished implements driver.OutboxExecutor. With
// Config.OutboxDeletePublished it deletes the rows instead.
func (e *executor) OutboxMarkPublished(ctx context.Context, p *driver.OutboxMarkPublishedParams) error {
	if len(p.IDs) == 0 {
		return nil
	}
	var err error
	if e.d.cfg.OutboxDeletePublished {
		_, err = e.db.ExecContext(ctx, e.d.expand(pgsql.OutboxDeleteMarkedSQL), intArray(p.IDs))
	} else {
		_, err = e.db.ExecContext(ctx, e.d.expand(pgsql.OutboxMarkPublishedSQL), intArray(p.IDs), p.At)
	}
	return mapErr("outbox mark published", err)
}

// execRow runs a statement that must change row id, or fails with
// ErrNotFound.
func (e *executor) execRow(ctx context.Context, op, query string, id int64, args ...any) error {
	res, err := e.db.ExecContext(ctx, e.d.expand(query), append([]any{id}, args...)...)
	n, err := rowsAffected(op, res, err)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("pgsqldriver: %s: row %d: %w", op, id, driver.ErrNotFound)
	}
	return nil
}

// OutboxMarkFailed implements driver.OutboxExecutor.
func (e *executor) OutboxMarkFailed(ctx context.Context, p *driver.OutboxMarkFailedParams) error {
	return e.execRow(ctx, "outbox mark failed", pgsql.OutboxMarkFailedSQL, p.ID, p.Error, p.NextAttempt)
}

// OutboxPark implements driver.OutboxExecutor.
func (e *executor) OutboxPark(ctx context.Context, p *driver.OutboxParkParams) error {
	return e.execRow(ctx, "outbox park", pgsql.OutboxParkSQL, p.ID, p.Error, p.At)
}

// OutboxDeletePublishedBefore implements driver.OutboxExecutor (see
// pgsql.OutboxDeletePublishedBeforeSQL).
func (e *executor) OutboxDeletePublishedBefore(ctx context.Context, p *driver.OutboxDeletePublishedBeforeParams) (driver.DeleteResult[driver.OutboxCursor], error) {
	res := driver.DeleteResult[driver.OutboxCursor]{Last: p.After}
	if p.Limit <= 0 {
		return res, fmt.Errorf("pgsqldriver: outbox delete: limit %d must be positive", p.Limit)
	}
	args := []any{p.Before, p.Limit}
	if !p.After.IsZero() {
		args = append(args, p.After.PublishedAt, p.After.ID)
	}
	var last driver.OutboxCursor
	n, err := e.retentionDelete(ctx, "outbox delete", pgsql.OutboxDeletePublishedBeforeSQL.Pick(!p.After.IsZero()), args,
		&last.PublishedAt, &last.ID)
	if err != nil || n == 0 {
		return res, err
	}
	return driver.DeleteResult[driver.OutboxCursor]{Deleted: n, Last: last}, nil
}

// OutboxOldestUnpublished implements driver.OutboxExecutor.
func (e *executor) OutboxOldestUnpublished(ctx context.Context) (time.Time, bool, error) {
	var oldest time.Time
	err := e.db.QueryRowContext(ctx, e.d.expand(pgsql.OutboxOldestUnpublishedSQL)).Scan(&oldest)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, mapErr("outbox oldest", err)
	}
	return oldest, true, nil
}

// OutboxCountParked implements driver.OutboxExecutor: a count of the
// parked pending rows through the index of the rows that failed
// (outbox_pending_blocked_idx).
func (e *executor) OutboxCountParked(ctx context.Context) (int, error) {
	var n int
	if err := e.db.QueryRowContext(ctx, e.d.expand(pgsql.OutboxCountParkedSQL)).Scan(&n); err != nil {
		return 0, mapErr("outbox count parked", err)
	}
	return n, nil
}

// OutboxLastPublished implements driver.OutboxExecutor: the last entry
// of the publication log's published_at index.
func (e *executor) OutboxLastPublished(ctx context.Context) (time.Time, bool, error) {
	if e.d.cfg.OutboxDeletePublished {
		return time.Time{}, false, errors.New("pgsqldriver: outbox last published: published rows are not kept (Config.OutboxDeletePublished)")
	}
	return e.lastTime(ctx, "outbox last published", pgsql.OutboxLastPublishedSQL)
}

// OutboxLastParked implements driver.OutboxExecutor: through the index of
// the rows that failed (outbox_pending_blocked_idx).
func (e *executor) OutboxLastParked(ctx context.Context) (time.Time, bool, error) {
	return e.lastTime(ctx, "outbox last parked", pgsql.OutboxLastParkedSQL)
}

// lastTime runs query, a max() of one timestamptz column, and returns
// false for its NULL.
func (e *executor) lastTime(ctx context.Context, op, query string) (time.Time, bool, error) {
	var last sql.NullTime
	if err := e.db.QueryRowContext(ctx, e.d.expand(query)).Scan(&last); err != nil {
		return time.Time{}, false, mapErr(op, err)
	}
	return last.Time, last.Valid, nil
}

// OutboxRedrive implements driver.OutboxExecutor (pgsql.OutboxRedriveSQL).
func (e *executor) OutboxRedrive(ctx context.Context, p *driver.OutboxRedriveParams) (int, error) {
	switch {
	case p.Limit <= 0:
		return 0, fmt.Errorf("pgsqldriver: outbox redrive: limit %d must be positive", p.Limit)
	case p.PublishedBefore.IsZero():
		return 0, errors.New("pgsqldriver: outbox redrive: PublishedBefore must be set")
	case e.d.cfg.OutboxDeletePublished:
		return 0, errors.New("pgsqldriver: outbox redrive: published rows are not kept (Config.OutboxDeletePublished)")
	}
	var keys any // NULL: every key
	if len(p.Keys) > 0 {
		keys = textArray(p.Keys)
	}
	res, err := e.db.ExecContext(ctx, e.d.expand(pgsql.OutboxRedriveSQL), p.PublishedSince, p.PublishedBefore, keys, p.Limit)
	n, err := rowsAffected("outbox redrive", res, err)
	return int(n), err
}

// OutboxRetryNow implements driver.OutboxExecutor (pgsql.OutboxRetryNowSQL).
func (e *executor) OutboxRetryNow(ctx context.Context, p *driver.OutboxRetryNowParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("pgsqldriver: outbox retry now: limit %d must be positive", p.Limit)
	}
	res, err := e.db.ExecContext(ctx, e.d.expand(pgsql.OutboxRetryNowSQL), p.At, p.Limit)
	n, err := rowsAffected("outbox retry now", res, err)
	return int(n), err
}

// OutboxUnpark implements driver.OutboxExecutor (pgsql.OutboxUnparkSQL).
func (e *executor) OutboxUnpark(ctx context.Context, p *driver.OutboxUnparkParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("pgsqldriver: outbox unpark: limit %d must be positive", p.Limit)
	}
	var before, ids, keys any // NULL: no bound, every event, every key
	if !p.ParkedBefore.IsZero() {
		before = p.ParkedBefore
	}
	if len(p.EventIDs) > 0 {
		ids = uuidArray(p.EventIDs)
	}
	if len(p.Keys) > 0 {
		keys = textArray(p.Keys)
	}
	res, err := e.db.ExecContext(ctx, e.d.expand(pgsql.OutboxUnparkSQL), before, ids, keys, p.Limit)
	n, err := rowsAffected("outbox unpark", res, err)
	return int(n), err
}
