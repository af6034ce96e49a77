package pgsql

// Retention deletes (see driver.DeleteResult). Each batch of a sweep
// resumes after the key of the last row the batch before it deleted, in
// the order (time, unique columns...), so that its index scan starts
// there: the entries of the rows deleted by the earlier batches stay in
// the index while any snapshot older than their deletion is open, and a
// scan from the start of the index would walk over all of them, once per
// batch.
//
// The retention indexes hold the time column only, so a statement reads
// its batch in two steps, each a range of that index, never the whole
// table whatever the plan (generic plans of prepared statements included):
//
//	w: the first limit rows after the cursor in index order (time only),
//	   locked (FOR UPDATE SKIP LOCKED: a row that another transaction
//	   holds is passed over, and left for the next sweep). Every row after
//	   the cursor older than their greatest time is among them, but for
//	   rows held by other transactions;
//	g: the other rows of that greatest time after the cursor (the index
//	   returns the rows of one time in no useful order), the first limit of
//	   them by the whole key, locked;
//	v: the first limit rows of w and g by the whole key.
//
// Then the statement deletes v's rows and returns one row: how many it
// deleted, with the key of the last (none when it deleted nothing). A
// batch reads about limit entries, plus those of the rows that share the
// greatest time: a table whose rows share their time value in groups much
// larger than a batch is swept in about group²/limit reads per group. The
// drivers write one time per inbox batch, per published outbox batch, per
// record and per saga. A statement locks at most 2×limit rows.

// RetentionSQL is the statement of one batch of a retention delete, in two
// variants: First for the zero cursor (the first batch of a sweep), After
// with the cursor in the parameters that follow the statement's own.
type RetentionSQL struct{ First, After string }

// Pick returns After when the batch resumes after a cursor, First for the
// zero cursor.
func (r RetentionSQL) Pick(resume bool) string {
	if resume {
		return r.After
	}
	return r.First
}

// keyset is the description of one retention delete.
type keyset struct {
	table string // the table read and locked
	cols  string // more columns the delete needs of v's rows than the key's (ctid), or ""
	uniq  string // columns that identify a row
	where string // the retention condition
	time  string // the indexed time column
	key   string // the whole key, time first, comma-separated
	after string // the key of the cursor, as parameters: "($3, $4)"
	limit string // the limit parameter
	// rest follows the CTEs w, g and v: more CTEs (the delete, named d),
	// then the final SELECT (see last).
	rest string
}

func (k keyset) sql() RetentionSQL {
	return RetentionSQL{First: k.build(""), After: k.build(" AND (" + k.key + ") > " + k.after)}
}

func (k keyset) build(after string) string {
	where := k.where + after
	sel := k.key
	if k.cols != "" {
		sel = k.cols + ", " + sel
	}
	return `WITH w AS (
			SELECT ` + sel + ` FROM ` + k.table + `
			WHERE ` + where + `
			ORDER BY ` + k.time + ` LIMIT ` + k.limit + `
			FOR UPDATE SKIP LOCKED
		), g AS (
			SELECT ` + sel + ` FROM ` + k.table + `
			WHERE ` + where + ` AND ` + k.time + ` = (SELECT max(` + k.time + `) FROM w)
				AND (` + k.uniq + `) NOT IN (SELECT ` + k.uniq + ` FROM w)
			ORDER BY ` + k.key + ` LIMIT ` + k.limit + `
			FOR UPDATE SKIP LOCKED
		), v AS (
			SELECT * FROM w UNION ALL SELECT * FROM g
			ORDER BY ` + k.key + ` LIMIT ` + k.limit + `
		)` + k.rest
}

// last is the final SELECT of a retention delete: the number of rows of
// the CTE d (its RETURNING key) and the greatest key among them, in one
// row; no row when d is empty.
func last(key, desc string) string {
	return `
		SELECT count(*) OVER (), ` + key + ` FROM d ORDER BY ` + desc + ` LIMIT 1`
}

var (
	// RecordDeleteExpiredSQL deletes at most $2 records that expired at
	// or before $1, after the cursor ($3, $4, $5) in (expires_at, scope,
	// idempotency_key) order, by ctid.
	RecordDeleteExpiredSQL = keyset{
		table: "{{table}}idempotency_record",
		cols:  "ctid",
		uniq:  "scope, idempotency_key",
		where: "expires_at <= $1",
		time:  "expires_at",
		key:   "expires_at, scope, idempotency_key",
		after: "($3::timestamptz, $4::text, $5::text)",
		limit: "$2",
		rest: `, d AS (
			DELETE FROM {{table}}idempotency_record WHERE ctid = ANY (ARRAY(SELECT ctid FROM v))
			RETURNING expires_at, scope, idempotency_key
		)` + last("expires_at, scope, idempotency_key", "expires_at DESC, scope DESC, idempotency_key DESC"),
	}.sql()

	// InboxDeleteBeforeSQL deletes at most $3 rows of consumer $2 (every
	// consumer for '') processed before $1, after the cursor ($4, $5, $6)
	// in (processed_at, consumer_name, event_id) order. It deletes by
	// primary key, not ctid, so that it stays exact on a partitioned
	// processed_event (a ctid is unique within one partition only); the
	// event_id = ANY lets a partitioned table prune to the partitions of
	// the batch's ids.
	InboxDeleteBeforeSQL = keyset{
		table: "{{table}}processed_event",
		uniq:  "event_id, consumer_name",
		where: "processed_at < $1 AND ($2::text = '' OR consumer_name = $2::text)",
		time:  "processed_at",
		key:   "processed_at, consumer_name, event_id",
		after: "($4::timestamptz, $5::text, $6::uuid)",
		limit: "$3",
		rest: `, d AS (
			DELETE FROM {{table}}processed_event
			WHERE event_id = ANY (ARRAY(SELECT event_id FROM v))
				AND (event_id, consumer_name) IN (SELECT event_id, consumer_name FROM v)
			RETURNING processed_at, consumer_name, event_id
		)` + last("processed_at, consumer_name, event_id", "processed_at DESC, consumer_name DESC, event_id DESC"),
	}.sql()

	// OutboxDeletePublishedBeforeSQL deletes at most $2 publication log
	// rows older than $1, after the cursor ($3, $4) in (published_at, id)
	// order (by ctid, skipping rows a concurrent cleaner or redrive
	// holds), then their events, and returns how many log rows it deleted:
	// the batch's progress, which counts a log row whose event is already
	// gone (deleted by hand), so such rows never end a sweep early. The
	// NOT EXISTS is a guard: an event with a pending row is never deleted.
	OutboxDeletePublishedBeforeSQL = keyset{
		table: "{{table}}outbox_published",
		cols:  "ctid",
		uniq:  "id",
		where: "published_at < $1",
		time:  "published_at",
		key:   "published_at, id",
		after: "($3::timestamptz, $4::bigint)",
		limit: "$2",
		rest: `, d AS (
			DELETE FROM {{table}}outbox_published WHERE ctid = ANY (ARRAY(SELECT ctid FROM v))
			RETURNING published_at, id
		), o AS (
			DELETE FROM {{table}}outbox o
			WHERE o.id = ANY (ARRAY(SELECT id FROM d))
			  AND NOT EXISTS (SELECT 1 FROM {{table}}outbox_pending p WHERE p.id = o.id)
		)` + last("published_at, id", "published_at DESC, id DESC"),
	}.sql()

	// SagaDeleteFinishedBeforeSQL deletes at most $2 sagas finished before
	// $1, after the cursor ($3, $4) in (finished_at, saga_id) order, by
	// ctid; their steps go with them (ON DELETE CASCADE).
	SagaDeleteFinishedBeforeSQL = keyset{
		table: "{{table}}saga",
		cols:  "ctid",
		uniq:  "saga_id",
		where: "finished_at IS NOT NULL AND finished_at < $1",
		time:  "finished_at",
		key:   "finished_at, saga_id",
		after: "($3::timestamptz, $4::text)",
		limit: "$2",
		rest: `, d AS (
			DELETE FROM {{table}}saga WHERE ctid = ANY (ARRAY(SELECT ctid FROM v))
			RETURNING finished_at, saga_id
		)` + last("finished_at, saga_id", "finished_at DESC, saga_id DESC"),
	}.sql()
)

// InboxDeleteDefaultSQL is InboxDeleteBeforeSQL for one plain table, the
// default partition of a partitioned processed_event (table, quoted), where
// a ctid is exact.
func InboxDeleteDefaultSQL(table string) RetentionSQL {
	return keyset{
		table: table,
		cols:  "ctid",
		uniq:  "event_id, consumer_name",
		where: "processed_at < $1 AND ($2::text = '' OR consumer_name = $2::text)",
		time:  "processed_at",
		key:   "processed_at, consumer_name, event_id",
		after: "($4::timestamptz, $5::text, $6::uuid)",
		limit: "$3",
		rest: `, d AS (
			DELETE FROM ` + table + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM v))
			RETURNING processed_at, consumer_name, event_id
		)` + last("processed_at, consumer_name, event_id", "processed_at DESC, consumer_name DESC, event_id DESC"),
	}.sql()
}
