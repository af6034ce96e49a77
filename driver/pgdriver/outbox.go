package pgdriver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
	"github.com/idemkit/idem/internal/dberr"
)

// OutboxChannel is the notification channel on which OutboxInsert signals
// new outbox rows: "<schema>.<prefix>idem_outbox", or
// "<prefix>idem_outbox" without Config.Schema, so that relays of different
// schemas or prefixes in one database do not wake each other. Without
// Config.Schema, <schema> is the one the outbox table is found in through
// search_path, read once by the driver's first enqueue, claim or
// ListenOutbox; until then the channel is "<prefix>idem_outbox". A name
// longer than PostgreSQL's 63-byte identifier limit is replaced by a hash
// of it.
func (d *Driver) OutboxChannel() string {
	return d.names.OutboxKnown().OutboxChannel()
}

// notifyChannel is the channel OutboxInsert notifies: n's, or "" (no
// notify) with Config.NoOutboxNotify.
func (d *Driver) notifyChannel(n *pgsql.Names) string {
	if d.cfg.NoOutboxNotify {
		return ""
	}
	return n.OutboxChannel()
}

// outboxNames returns the names of the outbox's channel and lane locks (see
// pgsql.Names.Outbox), reading the outbox table's schema through db if needed.
func (d *Driver) outboxNames(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (*pgsql.Names, error) {
	n, err := d.names.Outbox(ctx, func(ctx context.Context) (string, error) {
		var s string
		return s, db.QueryRow(ctx, pgsql.OutboxSchemaSQL, d.names.OutboxTableName()).Scan(&s)
	})
	if err != nil {
		return nil, mapErr("outbox: schema", err)
	}
	return n, nil
}

// OutboxInsert implements driver.OutboxExecutor with one statement for the
// whole batch: the rows are passed as arrays and inserted in their order
// (WITH ORDINALITY ... ORDER BY), so their IDs follow it; a trigger of
// migration 008 gives each new row its outbox_pending row in the same
// statement. When at least one
// row is new, the same statement calls pg_notify(OutboxChannel(), ”): the
// notification is delivered when the caller's transaction commits, and never
// if it rolls back. See ListenOutbox.
func (e *executor) OutboxInsert(ctx context.Context, rows []driver.OutboxRow) (int, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	ids := uuidArrayOf(len(rows), func(i int) uuid.UUID { return rows[i].EventID })
	a := pgsql.NewOutboxInsertArrays(rows)
	names, err := e.d.outboxNames(ctx, e.db)
	if err != nil {
		return 0, err
	}
	// The notify CTE is not referenced by the INSERT; the final SELECT reads
	// it so that it runs, after the insert, and only when a row was new.
	var inserted, notified int
	err = e.db.QueryRow(ctx, e.d.expand(pgsql.OutboxInsertSQL),
		ids, a.Types, a.Keys, a.Sagas, a.Payloads, a.Headers, a.Occurred, a.Created, e.d.notifyChannel(names),
	).Scan(&inserted, &notified)
	if err != nil {
		return 0, mapErr("outbox insert", err)
	}
	return inserted, nil
}

// OutboxLanes is the number of outbox lanes (migration 006): every row is
// in lane abs(hashtextextended(record_key, 0) % OutboxLanes), so all the
// rows of a key share a lane.
const OutboxLanes = pgsql.OutboxLanes

// lanesPerClaim is the most lanes one claim takes, so that concurrent
// claims (several relays, or one relay's workers) share the pending lanes
// instead of one claim holding them all.
const lanesPerClaim = pgsql.LanesPerClaim

// OutboxClaimBatch implements driver.OutboxExecutor with lanes (see
// migrations 006_outbox_lanes.sql and 008_outbox_pending.sql). The events
// not yet published each have a narrow row in outbox_pending (id, key,
// lane, failure state), deleted when the event is published; the event
// itself (payload, headers) is the outbox row, written once. The claim
// takes two statements:
//
//  1. lanes: the lanes that have pending rows not parked (a loose scan of
//     outbox_pending_lane_idx: one probe per pending lane), then up to lanesPerClaim of them
//     (and no more than limit),
//     each locked with pg_try_advisory_xact_lock (a lane another
//     transaction holds is skipped), starting at a random lane so that
//     claims spread over the lanes (OFFSET 0 keeps the planner from
//     moving the lock below the sort, which would lock every pending lane).
//     The lock is what keeps two relays off the same key: a key's
//     rows are all in one lane, and the lane's owner holds it until it has
//     marked what it published (the end of its transaction).
//  2. rows: lane after lane, each lane's pending rows in ID order through
//     the (lane, id) index, skipping the keys that are blocked (an earlier
//     unpublished row of the key is parked or backing off:
//     outbox_pending_blocked_idx, almost always empty), until limit rows
//     are read, each joined to its outbox row by primary key; then sorted
//     by ID. Each key's rows are thus a prefix of its claimable
//     queue, and a claim reads about limit rows however many keys are
//     pending and however long their queues are. The lanes it locked but
//     did not need wait for the next claim. When the lanes it took yield
//     no row (every key in them is backing off), it takes the next
//     lanes, so a claim returns a row whenever one is claimable. The rows
//     are kept, in the order read, until their payloads would pass
//     p.MaxBytes (the first always): see pgsql.ReadBound, which leaves
//     the others out in Go while payloads are small (free) and in the
//     statement while they are large (not sent).
//
// The rows are read by a second statement because under READ COMMITTED a
// statement's snapshot is taken when it starts: a lane whose lock was
// released by a relay that just committed its marks could otherwise be read
// with a snapshot from before that commit, and its rows published again.
// The second statement's snapshot is taken after the locks are held, and
// PostgreSQL releases a transaction's locks only once its commit is
// visible.
//
// A lane's lock guards its keys only if each key's rows commit in ID order
// (package outbox asks callers to serialise a key's transactions). A row
// whose lower ID commits after its lane published a later row of its key is
// published after it: never lost, never twice, but out of order. See
// TestOutboxLowerIDCommittedLate.
func (e *executor) OutboxClaimBatch(ctx context.Context, p *driver.OutboxClaimBatchParams) ([]driver.OutboxRow, error) {
	now, limit := p.Now, p.Limit
	if !e.inTx {
		return nil, errors.New("pgdriver: outbox claim: must run in a transaction held until the rows are marked (use UnwrapExecutor)")
	}
	if limit <= 0 {
		return nil, fmt.Errorf("pgdriver: outbox claim: limit %d must be positive", limit)
	}
	if err := e.d.iso.Check(ctx, "pgdriver: outbox claim", func(ctx context.Context) (level string, err error) {
		return level, e.db.QueryRow(ctx, pgsql.TxIsolationSQL).Scan(&level)
	}); err != nil {
		return nil, err
	}
	names, err := e.d.outboxNames(ctx, e.db)
	if err != nil {
		return nil, err
	}
	class, legacy := names.OutboxLockClass(), e.d.names.LegacyOutboxLockClass()
	start := rand.IntN(OutboxLanes)
	tried := []int16{}
	var out []driver.OutboxRow
	// Lanes whose every key is blocked (backing off) yield no row: then
	// the next lanes are tried, in the same transaction, so that a claim
	// returns a row whenever one is claimable.
	for len(out) == 0 && len(tried) < OutboxLanes {
		// Batch 1: the planner setting of the read (see pgsql.OutboxReadSQL),
		// then the lanes.
		b1 := &pgx.Batch{}
		if ms, ok := pgsql.HoldTimeoutMillis(p.HoldTimeout); ok && len(tried) == 0 {
			b1.Queue(pgsql.OutboxHoldTimeoutSQL, ms)
		}
		// A server that does not report whether the session is read-only
		// (before PostgreSQL 14, or a pooler that does not pass it on) is
		// asked, in the same round trip.
		var readOnlySetting string
		if len(tried) == 0 && (e.d.askReadOnly || !reportsReadOnly(e.db)) {
			b1.Queue(pgsql.OutboxBitmapOffReadOnlySQL).QueryRow(func(row pgx.Row) error {
				var bitmap string
				return row.Scan(&bitmap, &readOnlySetting)
			})
		} else {
			b1.Queue(pgsql.OutboxBitmapOffSQL)
		}
		var lanes []int16
		n := min(lanesPerClaim, limit) // a claimable lane yields at least one row
		if len(tried) > 0 {
			n = lanesPerClaim // those tried yielded none
		}
		b1.Queue(e.d.expand(outboxLanesSQL), start, class, n, tried, legacy).
			Query(func(rows pgx.Rows) error {
				var err error
				lanes, err = pgx.CollectRows(rows, pgx.RowTo[int16])
				return err
			})
		if err := e.db.SendBatch(ctx, b1).Close(); err != nil {
			return nil, mapErr("outbox claim: lanes", err)
		}
		if readOnlySetting == "on" {
			return nil, fmt.Errorf("pgdriver: outbox claim: %w; nothing claimed or published", dberr.ReadOnlySession("transaction_read_only"))
		}
		if err := readOnly(e.db); err != nil {
			// The marks would fail: publishing now would publish the
			// same events again at every round while the database
			// stays read-only.
			return nil, fmt.Errorf("pgdriver: outbox claim: %w; nothing claimed or published", err)
		}
		// Batch 2: the rows, then the setting back to the session's.
		b2 := &pgx.Batch{}
		if len(lanes) > 0 {
			read, bounded := e.d.read.Statement(p.MaxBytes)
			args := []any{lanes, now, limit}
			if bounded {
				args = append(args, p.MaxBytes)
			}
			b2.Queue(e.d.expand(read), args...).Query(func(rows pgx.Rows) error {
				var err error
				out = pgsql.Cut(&e.d.read, p.MaxBytes, func() (driver.OutboxRow, int, bool) {
					if err != nil || !rows.Next() {
						return driver.OutboxRow{}, 0, false
					}
					var r driver.OutboxRow
					r, err = scanOutboxRow(rows)
					return r, len(r.Payload), err == nil
				})
				if err != nil {
					return err
				}
				return rows.Err()
			})
		}
		b2.Queue(pgsql.OutboxBitmapDefaultSQL)
		if err := e.db.SendBatch(ctx, b2).Close(); err != nil {
			return nil, mapErr("outbox claim", err)
		}
		if len(lanes) == 0 {
			break // no other lane is pending, or all are taken
		}
		tried = append(tried, lanes...)
	}
	slices.SortFunc(out, func(a, b driver.OutboxRow) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// readOnly returns dberr.ReadOnly's error when db is a transaction whose
// session PostgreSQL reports read-only (a hot standby, or
// default_transaction_read_only): read from what the server reported
// with its last answer, no round trip.
func readOnly(db dbtx) error {
	if tx, ok := db.(interface{ Conn() *pgx.Conn }); ok {
		return dberr.ReadOnly(tx.Conn().PgConn().ParameterStatus)
	}
	return nil
}

// reportsReadOnly reports whether the server reports to the client whether
// db's session is read-only (in_hot_standby, PostgreSQL 14 and later; a
// pooler may not pass it on), which readOnly reads.
func reportsReadOnly(db dbtx) bool {
	if tx, ok := db.(interface{ Conn() *pgx.Conn }); ok {
		return tx.Conn().PgConn().ParameterStatus("in_hot_standby") != ""
	}
	return false
}

// The statements of OutboxClaimBatch. pgsql.OutboxReadSQL runs with bitmap scans
// off (SET LOCAL, reset after it): the planner otherwise reads a whole lane
// with a bitmap scan and sorts it whenever it expects the lane to hold not
// much more than limit rows (2-4 ms instead of 1-2 ms for 500 rows of 1,000
// keys), and with one busy key it would read that key's whole backlog each
// time (50,000 rows for a batch of 500). The range scan of outbox_pending_lane_idx
// reads the lane in ID order and stops at limit.
const (
	outboxLanesSQL = pgsql.OutboxLanesSQL
)

// The first key of the lanes' advisory locks is a hash of the outbox
// table's name, its schema included (pgsql.Names.Outbox), so that idem
// schemas sharing a database do not block each other's lanes. (The two-int4
// advisory lock key space does not overlap the bigint one that idempotency
// records use.)

// scanOutboxRow scans the pgsql.OutboxColumns of row, then extra.
func scanOutboxRow(row pgx.CollectableRow, extra ...any) (driver.OutboxRow, error) {
	var (
		r                          driver.OutboxRow
		id                         pgtype.UUID
		saga, lastErr              *string
		attempts                   int32
		nextAttempt, parked, pubAt *time.Time
	)
	err := row.Scan(append([]any{&r.ID, &id, &r.EventType, &r.Key, &saga, &r.Payload, &r.Headers,
		&r.OccurredAt, &r.CreatedAt, &attempts, &lastErr, &nextAttempt, &parked, &pubAt}, extra...)...)
	if err != nil {
		return r, err
	}
	r.EventID = uuid.UUID(id.Bytes)
	r.Attempts = int(attempts)
	if saga != nil {
		r.SagaID = *saga
	}
	if lastErr != nil {
		r.LastError = *lastErr
	}
	if nextAttempt != nil {
		r.NextAttemptAt = *nextAttempt
	}
	if parked != nil {
		r.ParkedAt = *parked
	}
	if pubAt != nil {
		r.PublishedAt = *pubAt
	}
	return r, nil
}

// OutboxMarkPublished implements driver.OutboxExecutor in one statement: it
// deletes the rows' pending rows and appends (id, p.At) to the publication
// log outbox_published for those it deleted, so a row already published
// keeps its first time. The outbox row is not touched: marking costs a
// narrow DELETE and a narrow INSERT per event, not a new version of the
// event's row. With Config.OutboxDeletePublished it deletes the pending
// rows and the events instead.
func (e *executor) OutboxMarkPublished(ctx context.Context, p *driver.OutboxMarkPublishedParams) error {
	ids, at := p.IDs, p.At
	if len(ids) == 0 {
		return nil
	}
	if e.d.cfg.OutboxDeletePublished {
		_, err := e.db.Exec(ctx, e.d.expand(pgsql.OutboxDeleteMarkedSQL), ids)
		return mapErr("outbox mark published", err)
	}
	_, err := e.db.Exec(ctx, e.d.expand(pgsql.OutboxMarkPublishedSQL), ids, at)
	return mapErr("outbox mark published", err)
}

// OutboxMarkFailed implements driver.OutboxExecutor.
func (e *executor) OutboxMarkFailed(ctx context.Context, p *driver.OutboxMarkFailedParams) error {
	id, errText, nextAttempt := p.ID, p.Error, p.NextAttempt
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.OutboxMarkFailedSQL), id, errText, nextAttempt)
	if err != nil {
		return mapErr("outbox mark failed", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: outbox mark failed: row %d: %w", id, driver.ErrNotFound)
	}
	return nil
}

// OutboxPark implements driver.OutboxExecutor.
func (e *executor) OutboxPark(ctx context.Context, p *driver.OutboxParkParams) error {
	id, errText, at := p.ID, p.Error, p.At
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.OutboxParkSQL), id, errText, at)
	if err != nil {
		return mapErr("outbox park", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: outbox park: row %d: %w", id, driver.ErrNotFound)
	}
	return nil
}

// OutboxDeletePublishedBefore implements driver.OutboxExecutor. Like
// RecordDeleteExpired, it deletes publication log rows after p.After by
// ctid from bounded subqueries (see pgsql.OutboxDeletePublishedBeforeSQL),
// and skips rows a concurrent cleaner or redrive holds; the same statement
// deletes their events. It returns how many log rows it deleted.
func (e *executor) OutboxDeletePublishedBefore(ctx context.Context, p *driver.OutboxDeletePublishedBeforeParams) (driver.DeleteResult[driver.OutboxCursor], error) {
	res := driver.DeleteResult[driver.OutboxCursor]{Last: p.After}
	if p.Limit <= 0 {
		return res, fmt.Errorf("pgdriver: outbox delete: limit %d must be positive", p.Limit)
	}
	args := []any{p.Before, p.Limit}
	if !p.After.IsZero() {
		args = append(args, p.After.PublishedAt, p.After.ID)
	}
	var last driver.OutboxCursor
	var n int
	err := e.db.QueryRow(ctx, e.d.expand(pgsql.OutboxDeletePublishedBeforeSQL.Pick(!p.After.IsZero())), args...).
		Scan(&n, &last.PublishedAt, &last.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, nil
	}
	if err != nil {
		return res, mapErr("outbox delete", err)
	}
	return driver.DeleteResult[driver.OutboxCursor]{Deleted: n, Last: last}, nil
}

// OutboxOldestUnpublished implements driver.OutboxExecutor. It reads the
// lowest-ID unpublished row through the pending index, so it costs the same
// however large the backlog is.
func (e *executor) OutboxOldestUnpublished(ctx context.Context) (time.Time, bool, error) {
	var oldest time.Time
	err := e.db.QueryRow(ctx, e.d.expand(pgsql.OutboxOldestUnpublishedSQL)).Scan(&oldest)
	if errors.Is(err, pgx.ErrNoRows) {
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
	if err := e.db.QueryRow(ctx, e.d.expand(pgsql.OutboxCountParkedSQL)).Scan(&n); err != nil {
		return 0, mapErr("outbox count parked", err)
	}
	return n, nil
}

// OutboxLastPublished implements driver.OutboxExecutor: the last entry
// of the publication log's published_at index.
func (e *executor) OutboxLastPublished(ctx context.Context) (time.Time, bool, error) {
	if e.d.cfg.OutboxDeletePublished {
		return time.Time{}, false, errors.New("pgdriver: outbox last published: published rows are not kept (Config.OutboxDeletePublished)")
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
	var last *time.Time
	if err := e.db.QueryRow(ctx, e.d.expand(query)).Scan(&last); err != nil {
		return time.Time{}, false, mapErr(op, err)
	}
	if last == nil {
		return time.Time{}, false, nil
	}
	return *last, true, nil
}

// OutboxRedrive implements driver.OutboxExecutor with one statement
// (pgsql.OutboxRedriveSQL) that changes at most p.Limit rows found through
// the publication log's published_at index, in its order: their log rows
// are deleted and their pending rows inserted again.
func (e *executor) OutboxRedrive(ctx context.Context, p *driver.OutboxRedriveParams) (int, error) {
	if err := checkRedrive(p); err != nil {
		return 0, err
	}
	if e.d.cfg.OutboxDeletePublished {
		return 0, errors.New("pgdriver: outbox redrive: published rows are not kept (Config.OutboxDeletePublished)")
	}
	var keys []string
	if len(p.Keys) > 0 {
		keys = p.Keys
	}
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.OutboxRedriveSQL), p.PublishedSince, p.PublishedBefore, keys, p.Limit)
	if err != nil {
		return 0, mapErr("outbox redrive", err)
	}
	return int(tag.RowsAffected()), nil
}

func checkRedrive(p *driver.OutboxRedriveParams) error {
	switch {
	case p.Limit <= 0:
		return fmt.Errorf("pgdriver: outbox redrive: limit %d must be positive", p.Limit)
	case p.PublishedBefore.IsZero():
		return errors.New("pgdriver: outbox redrive: PublishedBefore must be set")
	}
	return nil
}

// ListenOutbox LISTENs on OutboxChannel and returns a channel that receives a
// value soon after a transaction that enqueued outbox rows commits. Pass it
// as outbox.RelayConfig.Wake, so the relay publishes new events at once
// instead of at its next poll:
//
//	wake, err := drv.ListenOutbox(ctx, nil)
//	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{Wake: wake})
//
// Signals are coalesced (the channel has capacity 1 and a send never blocks)
// and carry no data: a wake-up only means "look now". Notifications are a
// latency optimisation, never the source of truth: the relay still polls, so
// a lost notification delays an event by at most the poll interval.
//
// The listener holds a dedicated connection, opened with
// Config.ListenConnConfig, or by default with the pool's connection config
// and its BeforeConnect hook (which may fetch the password: an IAM token;
// either way Config.ListenBeforeConnect, if set, has the last word at each
// connection), but outside the pool, so it takes no pool slot and a busy pool never
// delays it (except, without Config.Schema, for the one
// read of the outbox's schema through the pool, if no enqueue or claim of
// the driver did it before: the pool's connections, not the listener's,
// say which schema search_path finds). Connecting and LISTENing get 30s
// (the caller's ctx may end them sooner): a connection the network
// black-holes while it is made fails then. ListenOutbox returns once LISTEN is in effect:
// every enqueue committed after it returns is signalled. After a connection
// error, or when its connection, after 30s without a notification, does
// not answer a round trip within 5s (a network that drops the connection's
// packets without closing it, which fails no wait: a partition, a failover
// behind a load balancer or NAT), it reconnects with backoff (up to 5s;
// each attempt bounded to 30s), reports the error, and each
// failed attempt's, to onError (if not nil), calls onError(nil) once it has
// reconnected (so that a caller logging the errors can log their end, and
// limit the lines in between: the attempts fail every 5s while the
// database is down) and sends one signal per reconnection, because
// notifications sent while it was disconnected are lost. It stops and closes its
// connection when ctx is done; the channel is never closed.
//
// Behind a pooler in transaction mode (Config.TransactionPooling, or the
// pool's config reaching a server process other than the one its
// connection was given) and without Config.ListenConnConfig it returns an
// error wrapping errors.ErrUnsupported: such a pooler passes a server's
// notifications to a client only while the client runs a transaction.
// outbox.Relay then polls, and says so in its log.
func (d *Driver) ListenOutbox(ctx context.Context, onError func(error)) (<-chan struct{}, error) {
	if d.cfg.NoOutboxNotify {
		return nil, fmt.Errorf("%s: outbox listen: %w", "pgdriver", driver.ErrOutboxNotifyOff)
	}
	l, err := pgsql.ListenConnect(ctx, d.listenConn)
	if err != nil {
		return nil, err
	}
	wake := make(chan struct{}, 1)
	go pgsql.ListenLoop(ctx, "pgdriver", l, d.listenConn, wake, onError)
	return wake, nil
}

// listenPooledHint says what to do when the pool goes through a pooler.
const listenPooledHint = "set pgdriver.Config.ListenConnConfig to a direct connection to PostgreSQL"

// listener is a dedicated connection LISTENing on the outbox channel.
type listener struct{ conn *pgx.Conn }

func (l listener) Wait(ctx context.Context) error {
	_, err := l.conn.WaitForNotification(ctx)
	return err
}

func (l listener) Ping(ctx context.Context) error { return l.conn.Ping(ctx) }

func (l listener) Close() {
	closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = l.conn.Close(closeCtx)
}

// listenConn opens the listener's connection and LISTENs on it.
func (d *Driver) listenConn(ctx context.Context) (pgsql.Listener, error) {
	cc := d.cfg.ListenConnConfig
	if cc == nil {
		cc = d.pool.Config().ConnConfig
		if d.cfg.TransactionPooling {
			return nil, pgsql.ListenPooledError("pgdriver", listenPooledHint)
		}
	}
	cfg := cc.Copy()
	if before := d.pool.Config().BeforeConnect; before != nil && d.cfg.ListenConnConfig == nil {
		// The pool's hook, which may set what its connections must have
		// and its config does not (a password fetched when connecting:
		// an IAM token, a rotated secret). AfterConnect is not run: see
		// the schema below.
		if err := before(ctx, cfg); err != nil {
			return nil, fmt.Errorf("pgdriver: outbox listen: the pool's BeforeConnect: %w", err)
		}
	}
	if before := d.cfg.ListenBeforeConnect; before != nil {
		if err := before(ctx, cfg); err != nil {
			return nil, fmt.Errorf("pgdriver: outbox listen: Config.ListenBeforeConnect: %w", err)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgdriver: outbox listen: connect: %w", err)
	}
	if d.cfg.ListenConnConfig == nil {
		if err := pgsql.CheckListenSession(ctx, conn, "pgdriver", listenPooledHint); err != nil {
			_ = conn.Close(context.Background())
			return nil, err
		}
	}
	// The schema is found through the pool, not this connection: the
	// pool's connections may have a search_path of their own (set by
	// pgxpool.Config.AfterConnect, which this one does not run), and the
	// enqueuers notify the channel named after it.
	names, err := d.outboxNames(ctx, d.pool)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("pgdriver: outbox listen: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{names.OutboxChannel()}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("pgdriver: outbox listen: %w", err)
	}
	return listener{conn}, nil
}

// OutboxRetryNow implements driver.OutboxExecutor with one UPDATE of at
// most p.Limit rows backing off, found through the index of the rows that
// failed (pgsql.OutboxRetryNowSQL).
func (e *executor) OutboxRetryNow(ctx context.Context, p *driver.OutboxRetryNowParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("pgdriver: outbox retry now: limit %d must be positive", p.Limit)
	}
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.OutboxRetryNowSQL), p.At, p.Limit)
	if err != nil {
		return 0, mapErr("outbox retry now", err)
	}
	return int(tag.RowsAffected()), nil
}

// OutboxUnpark implements driver.OutboxExecutor with one UPDATE of at most
// p.Limit parked pending rows, found through the index of the rows that
// failed (outbox_pending_blocked_idx), in its order (pgsql.OutboxUnparkSQL).
func (e *executor) OutboxUnpark(ctx context.Context, p *driver.OutboxUnparkParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("pgdriver: outbox unpark: limit %d must be positive", p.Limit)
	}
	var before *time.Time
	if !p.ParkedBefore.IsZero() {
		before = &p.ParkedBefore
	}
	var ids *uuidArray // NULL: every event
	if len(p.EventIDs) > 0 {
		a := newUUIDArray(p.EventIDs)
		ids = &a
	}
	var keys []string // nil is NULL: every key
	if len(p.Keys) > 0 {
		keys = p.Keys
	}
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.OutboxUnparkSQL), before, ids, keys, p.Limit)
	if err != nil {
		return 0, mapErr("outbox unpark", err)
	}
	return int(tag.RowsAffected()), nil
}
