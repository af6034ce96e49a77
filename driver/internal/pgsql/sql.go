package pgsql

// Migrations (see the backends' migrate.go).
const (
	MigrationTableSQL = `CREATE TABLE IF NOT EXISTS {{table}}idem_migration (
		version         integer PRIMARY KEY,
		name            text NOT NULL,
		applied_at      timestamptz NOT NULL DEFAULT now(),
		compatible_from integer)`
	// MigrationCompatibleSQL adds compatible_from (driver.Migration's
	// CompatibleFrom) to a table created before it; MigrationHasCompatibleSQL
	// ($1: the table's rendered name) tells whether it is there, so that
	// the ALTER, whose lock would hold the table's readers until the
	// migration commits, runs once.
	MigrationCompatibleSQL    = `ALTER TABLE {{table}}idem_migration ADD COLUMN IF NOT EXISTS compatible_from integer`
	MigrationHasCompatibleSQL = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = 'compatible_from' AND NOT attisdropped)`
	// MigrationVersionsSQL reads the applied versions and their
	// compatible_from (0: none), also from a table created before that
	// column (through the row's JSON, which has no key for it then).
	MigrationVersionsSQL = `SELECT version, coalesce((to_jsonb(m) ->> 'compatible_from')::integer, 0)
		FROM {{table}}idem_migration m ORDER BY version`
	MigrationAppliedSQL = `SELECT EXISTS (SELECT 1 FROM {{table}}idem_migration WHERE version = $1)`
	MigrationRecordSQL  = `INSERT INTO {{table}}idem_migration (version, name, compatible_from) VALUES ($1, $2, $3)`
	MigrationLockSQL    = "SELECT pg_advisory_xact_lock($1)"
)

// Lock timeouts: a transaction-local lock_timeout around a statement that
// may wait, with the caller's own setting saved first and restored after.
// The wait is bounded by that lock_timeout (the caller's wait budget,
// idemhttp's Config.Wait): a statement_timeout of the role or database
// (often shorter, set for runaway queries) is off for it, and saved and
// restored with the lock_timeout, so that it does not cut the wait short
// (57014, which a caller would take for a failing store).
const (
	SaveLockTimeoutSQL = "SELECT set_config('idem.saved_lock_timeout', current_setting('lock_timeout'), true), " +
		"set_config('idem.saved_statement_timeout', current_setting('statement_timeout'), true)"
	SetLockTimeoutSQL     = "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', '0', true)"
	RestoreLockTimeoutSQL = "SELECT set_config('lock_timeout', current_setting('idem.saved_lock_timeout'), true), " +
		"set_config('statement_timeout', current_setting('idem.saved_statement_timeout'), true)"
)

// Idempotency records.
const (
	RecordColumns = `scope, idempotency_key, fingerprint, state, http_status, headers, body,
	lease_token, lease_expires_at, created_at, expires_at`

	// SQL of the claim. The INSERT ... ON CONFLICT DO NOTHING waits on the
	// unique index for a concurrent uncommitted claim of the same key, then
	// either inserts (the other rolled back) or does nothing. Doing nothing
	// takes no row lock and writes no WAL, so replays stay cheap; the read
	// that follows runs with a fresh snapshot (READ COMMITTED) and sees the
	// row the other transaction committed.
	ClaimInsertSQL = `INSERT INTO {{table}}idempotency_record
		(scope, idempotency_key, fingerprint, state, lease_token, lease_expires_at, created_at, expires_at)
		VALUES ($1, $2, $3, 'in_progress', $4, $5, $6, $7)
		ON CONFLICT (scope, idempotency_key) DO NOTHING
		RETURNING true`
	ClaimReadSQL = `SELECT ` + RecordColumns + `
		FROM {{table}}idempotency_record WHERE scope = $1 AND idempotency_key = $2`
	// ClaimTakeOverSQL replaces an expired record, or an abandoned
	// in-progress one with the same fingerprint. A concurrent taker blocks
	// on the row lock and then re-checks the condition, so only one wins.
	ClaimTakeOverSQL = `UPDATE {{table}}idempotency_record SET
			fingerprint = $3, state = 'in_progress', http_status = NULL, headers = NULL, body = NULL,
			lease_token = $4, lease_expires_at = $5, created_at = $6, expires_at = $7
		WHERE scope = $1 AND idempotency_key = $2
		  AND (expires_at <= $6 OR (state = 'in_progress' AND lease_expires_at <= $6 AND fingerprint = $3))`
	RecordCompleteSQL = `UPDATE {{table}}idempotency_record
		SET state = 'completed', http_status = $4, headers = $5, body = $6,
		    lease_token = NULL, lease_expires_at = NULL
		WHERE scope = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'`
	RecordReleaseSQL = `DELETE FROM {{table}}idempotency_record
		WHERE scope = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'`
	RecordExtendLeaseSQL = `UPDATE {{table}}idempotency_record SET lease_expires_at = $4
		WHERE scope = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'`
)

// The ModeTx fast path (driver.TxClaimer).
const (
	// ClaimTryLockSQL takes the key's transaction-scoped advisory lock if
	// it is free; ClaimLockSQL waits for it (bounded by the lock_timeout
	// set before it).
	ClaimTryLockSQL = `SELECT pg_try_advisory_xact_lock($1)`
	ClaimLockSQL    = `SELECT pg_advisory_xact_lock($1)`
	// ClaimReplayOrLockSQL is the uncontended path, outside any
	// transaction: NULL when the key holds a completed record live at $4
	// (nothing to lock: the caller replays it), else whether the key's
	// session-level advisory lock $3 was taken.
	ClaimReplayOrLockSQL = `SELECT CASE WHEN EXISTS (SELECT 1 FROM {{table}}idempotency_record
			WHERE scope = $1 AND idempotency_key = $2 AND state = 'completed' AND expires_at > $4)
		THEN NULL ELSE pg_try_advisory_lock($3) END`
	// UnlockSQL releases the session-level lock of ClaimReplayOrLockSQL.
	UnlockSQL = `SELECT pg_advisory_unlock($1)`
	// CompleteInsertSQL stores the completed record. It has no ON CONFLICT
	// on purpose: a key stored meanwhile by a writer that took no lock is
	// a unique violation, which aborts the transaction.
	CompleteInsertSQL = `INSERT INTO {{table}}idempotency_record
		(scope, idempotency_key, fingerprint, state, http_status, headers, body, created_at, expires_at)
		VALUES ($1, $2, $3, 'completed', $4, $5, $6, $7, $8)`
	// CompleteReplaceSQL replaces an expired or abandoned record, or
	// stores it again if the retention sweep deleted it since it was read
	// (an upsert); a record that is live again is not touched (0 rows).
	CompleteReplaceSQL = `INSERT INTO {{table}}idempotency_record AS r
			(scope, idempotency_key, fingerprint, state, http_status, headers, body, created_at, expires_at)
			VALUES ($1, $2, $3, 'completed', $4, $5, $6, $7, $8)
		ON CONFLICT (scope, idempotency_key) DO UPDATE SET
			fingerprint = EXCLUDED.fingerprint, state = 'completed', http_status = EXCLUDED.http_status,
			headers = EXCLUDED.headers, body = EXCLUDED.body, lease_token = NULL, lease_expires_at = NULL,
			created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
		WHERE r.expires_at <= $7 OR (r.state = 'in_progress' AND r.lease_expires_at <= $7 AND r.fingerprint = $3)`
)

// Named leases.
const (
	LockAcquireSQL = `INSERT INTO {{table}}idem_lock AS l (name, owner, expires_at)
		VALUES ($1, $2, $4)
		ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
		WHERE l.expires_at <= $3 OR l.owner = EXCLUDED.owner
		RETURNING true`
	LockRenewSQL = `UPDATE {{table}}idem_lock SET expires_at = $3
		WHERE name = $1 AND owner = $2`
	LockReleaseSQL = `DELETE FROM {{table}}idem_lock WHERE name = $1 AND owner = $2`
	LockGetSQL     = `SELECT owner, expires_at FROM {{table}}idem_lock WHERE name = $1`
)

// Consumer inbox.
const (
	// InboxPlainMin is the smallest batch (distinct ids) that InboxInsert
	// records with a plain INSERT first (InboxInsertAllSQL). Smaller ones
	// take the ON CONFLICT path at once: a caller that records events one
	// at a time in a long transaction then opens no subtransactions.
	InboxPlainMin = 8

	InboxSavepointSQL         = `SAVEPOINT idem_inbox_insert`
	InboxReleaseSQL           = `RELEASE SAVEPOINT idem_inbox_insert`
	InboxRollbackSavepointSQL = `ROLLBACK TO SAVEPOINT idem_inbox_insert`

	InboxInsertAllSQL = `INSERT INTO {{table}}processed_event (consumer_name, event_id, processed_at)
		SELECT $1, u.id, $3 FROM unnest($2::uuid[]) AS u(id) ORDER BY u.id`
	InboxInsertNewSQL = `INSERT INTO {{table}}processed_event (consumer_name, event_id, processed_at)
		SELECT $1, u.id, $3 FROM unnest($2::uuid[]) AS u(id) ORDER BY u.id
		ON CONFLICT (consumer_name, event_id) DO NOTHING
		RETURNING event_id`
	InboxOldestSQL = `SELECT min(processed_at) FROM {{table}}processed_event`
)

// Transactional outbox (migrations 003, 006 and 008): the event in outbox,
// written once; while unpublished, its delivery state in outbox_pending;
// once published, its publication time in outbox_published.
const (
	// OutboxColumns are the columns of an outbox row as the drivers scan
	// them (driver.OutboxRow's order), over the outbox row o and its
	// pending row p.
	OutboxColumns = `o.id, o.event_id, o.event_type, o.record_key, o.saga_id, o.payload, o.headers,
	o.occurred_at, o.created_at, p.attempts, p.last_error, p.next_attempt_at, p.parked_at, NULL::timestamptz`

	// OutboxLanes is the number of outbox lanes (migration 006): every
	// pending row is in lane abs(hashtextextended(record_key, 0) %
	// OutboxLanes), so all the rows of a key share a lane.
	OutboxLanes = 64
	// LanesPerClaim is the most lanes one claim takes, so that concurrent
	// claims share the pending lanes instead of one claim holding them all.
	LanesPerClaim = 16

	// OutboxInsertSQL inserts the rows given as arrays in their order, and
	// notifies $9 when one was new, unless $9 is '' (the driver's
	// NoOutboxNotify). The notify CTE is not referenced by
	// the INSERT; the final SELECT reads it so that it runs, after the
	// insert, and only when a row was new. Each new row's pending row is
	// written by the outbox_pending_insert trigger (migration 008).
	OutboxInsertSQL = `WITH ins AS (
			INSERT INTO {{table}}outbox
				(event_id, event_type, record_key, saga_id, payload, headers, occurred_at, created_at)
			SELECT u.event_id, u.event_type, u.record_key, u.saga_id, u.payload, u.headers::jsonb,
				u.occurred_at, u.created_at
			FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[],
				$7::timestamptz[], $8::timestamptz[]) WITH ORDINALITY
				AS u(event_id, event_type, record_key, saga_id, payload, headers, occurred_at, created_at, ord)
			ORDER BY u.ord
			ON CONFLICT (event_id) DO NOTHING
			RETURNING 1
		), notify AS (
			SELECT pg_notify($9, '') FROM (SELECT 1) AS one WHERE $9 <> '' AND EXISTS (SELECT 1 FROM ins)
		)
		SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM notify)`

	// The statements of OutboxClaimBatch (see pgdriver's for the design).
	// OutboxReadSQL runs with bitmap scans off (OutboxBitmapOffSQL before
	// it, OutboxBitmapDefaultSQL after it).
	OutboxBitmapOffSQL = `SET LOCAL enable_bitmapscan = off`
	// OutboxBitmapOffReadOnlySQL is OutboxBitmapOffSQL that also returns
	// transaction_read_only ("on" on a hot standby, or with
	// default_transaction_read_only): for a driver that cannot read what
	// the server reports (database/sql), in the same round trip.
	OutboxBitmapOffReadOnlySQL = `SELECT set_config('enable_bitmapscan', 'off', true), current_setting('transaction_read_only')`
	// OutboxHoldTimeoutSQL sets idle_in_transaction_session_timeout for
	// the claiming transaction ($1: milliseconds, as text; see
	// HoldTimeoutMillis).
	OutboxHoldTimeoutSQL   = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`
	OutboxBitmapDefaultSQL = `SET LOCAL enable_bitmapscan TO DEFAULT`
	OutboxLanesSQL         = `WITH RECURSIVE pending AS (
			(SELECT lane FROM {{table}}outbox_pending WHERE parked_at IS NULL ORDER BY lane LIMIT 1)
			UNION ALL
			SELECT (SELECT q.lane FROM {{table}}outbox_pending q
				WHERE q.parked_at IS NULL AND q.lane > p.lane ORDER BY q.lane LIMIT 1)
			FROM pending p WHERE p.lane IS NOT NULL
		)
		SELECT lane FROM (
			SELECT lane FROM pending WHERE lane IS NOT NULL AND lane <> ALL ($4::smallint[])
			ORDER BY (lane + 64 - $1) % 64 -- 64 = OutboxLanes
			OFFSET 0) s
		WHERE CASE WHEN NOT coalesce(pg_try_advisory_xact_lock_shared($5::int, lane), true) THEN false
			ELSE pg_try_advisory_xact_lock($2::int, lane) END -- $5: Names.LegacyOutboxLockClass
		LIMIT $3`
	// OutboxReadSQL reads the lanes' pending rows (p), then joins each to
	// its event (o) by primary key.
	OutboxReadSQL = `SELECT ` + OutboxColumns + ` FROM unnest($1::smallint[]) AS l(lane)` + outboxReadRows

	// OutboxReadBoundedSQL is OutboxReadSQL cut at $4 bytes of payloads:
	// of the rows OutboxReadSQL returns, in the order it reads them (lane
	// after lane, each lane's in ID order: a key's rows are in one lane,
	// in ID order), it keeps those whose payloads, summed in that order,
	// stay within $4, and always the first (see
	// driver.OutboxClaimBatchParams.MaxBytes). octet_length reads a stored
	// payload's size from its TOAST pointer: a row left out is neither
	// read from TOAST nor sent. The running sum costs a sort and a window
	// of the rows read (about 10% more time for 500 small events), so the
	// drivers use it only while the payloads are large (see ReadBound).
	OutboxReadBoundedSQL = `SELECT c.id, c.event_id, c.event_type, c.record_key, c.saga_id, c.payload, c.headers,
		c.occurred_at, c.created_at, c.attempts, c.last_error, c.next_attempt_at, c.parked_at, NULL::timestamptz
		FROM (
		SELECT r.*, sum(r.size) OVER w AS upto, row_number() OVER w AS n FROM (
		SELECT ` + OutboxColumns + `, l.ord, p.id AS pid, octet_length(o.payload) AS size
		FROM unnest($1::smallint[]) WITH ORDINALITY AS l(lane, ord)` + outboxReadRows + `) r
		WINDOW w AS (ORDER BY r.ord, r.pid ROWS UNBOUNDED PRECEDING)) c
		WHERE c.upto <= $4 OR c.n = 1`

	// outboxReadRows is the part of OutboxReadSQL and OutboxReadBoundedSQL
	// after the lanes (l): each lane's pending rows whose key has no
	// earlier row backing off or parked (p), in ID order, joined each to
	// its event (o). The key's blocked rows are probed in
	// outbox_pending_blocked_idx by key for each row read: OFFSET 0 keeps
	// the NOT EXISTS a subquery, so that the planner cannot make it an
	// anti-join that reads the whole index once and compares every row
	// read with every blocked row, as it did with statistics from a time
	// when nothing was blocked (almost always), once many keys backed off
	// (a broker outage: one claim ran for minutes).
	outboxReadRows = `
		CROSS JOIN LATERAL (
			SELECT q.id, q.attempts, q.last_error, q.next_attempt_at, q.parked_at
			FROM {{table}}outbox_pending q
			WHERE q.lane = l.lane AND q.parked_at IS NULL
			  AND NOT EXISTS (SELECT 1 FROM {{table}}outbox_pending b
				WHERE b.record_key = q.record_key AND b.id <= q.id
				  AND (b.parked_at IS NOT NULL OR b.next_attempt_at IS NOT NULL)
				  AND (b.parked_at IS NOT NULL OR b.next_attempt_at > $2) OFFSET 0)
			ORDER BY q.id
			LIMIT $3) p
		CROSS JOIN LATERAL (
			SELECT * FROM {{table}}outbox e WHERE e.id = p.id OFFSET 0) o
		LIMIT $3`

	// OutboxDeleteMarkedSQL deletes the published events that are still
	// pending (pgdriver's Config.OutboxDeletePublished); the
	// outbox_pending_delete trigger (migration 008) deletes their pending
	// rows.
	OutboxDeleteMarkedSQL = `DELETE FROM {{table}}outbox o
		WHERE o.id = ANY ($1::bigint[])
		  AND EXISTS (SELECT 1 FROM {{table}}outbox_pending p WHERE p.id = o.id)`
	// OutboxMarkPublishedSQL moves the rows from pending to published; a
	// row already published has no pending row and keeps its first time.
	OutboxMarkPublishedSQL = `WITH d AS (
			DELETE FROM {{table}}outbox_pending WHERE id = ANY ($1::bigint[]) RETURNING id)
		INSERT INTO {{table}}outbox_published (id, published_at) SELECT id, $2 FROM d`
	OutboxMarkFailedSQL = `UPDATE {{table}}outbox_pending
		SET attempts = attempts + 1, last_error = $2, next_attempt_at = $3
		WHERE id = $1`
	OutboxParkSQL = `UPDATE {{table}}outbox_pending
		SET attempts = attempts + 1, last_error = $2, parked_at = $3
		WHERE id = $1`
	OutboxOldestUnpublishedSQL = `SELECT o.created_at FROM {{table}}outbox o
		WHERE o.id = (SELECT min(id) FROM {{table}}outbox_pending)`
	// OutboxCountParkedSQL counts the parked pending rows through
	// outbox_pending_blocked_idx, the partial index of the rows that
	// failed (almost always empty), whose predicate this one implies.
	OutboxCountParkedSQL = `SELECT count(*) FROM {{table}}outbox_pending
		WHERE parked_at IS NOT NULL`
	// OutboxLastParkedSQL is the latest park time of the parked pending
	// rows, read through outbox_pending_blocked_idx as for
	// OutboxCountParkedSQL.
	OutboxLastParkedSQL = `SELECT max(parked_at) FROM {{table}}outbox_pending
		WHERE parked_at IS NOT NULL`
	// OutboxUnparkSQL clears the parked state, attempts and backoff of at
	// most $4 parked pending rows: those parked before $1 (if not NULL),
	// of the event IDs $2 (if not NULL) and of the keys $3 (if not NULL).
	// The parked rows are read through outbox_pending_blocked_idx (almost
	// always empty, as for OutboxCountParkedSQL) in its order, key by key
	// and each key's by id, up to $4 rows: the rows a batch unparks leave
	// the index, so the next batch starts at its front again and reads its
	// own rows only (in id order, each batch read and sorted every parked
	// row, or stepped over the rows unparked before it: 200,000 took 19
	// s). Each is joined to its event only to compare the event ID. The
	// outer parked_at IS NOT NULL is checked again on a row a concurrent
	// unpark changed meanwhile, so a row is counted once.
	OutboxUnparkSQL = `UPDATE {{table}}outbox_pending
		SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
		WHERE id = ANY (ARRAY(
			SELECT q.id FROM {{table}}outbox_pending q
			WHERE q.parked_at IS NOT NULL
				AND ($1::timestamptz IS NULL OR q.parked_at < $1::timestamptz)
				AND ($2::uuid[] IS NULL OR EXISTS (SELECT 1 FROM {{table}}outbox o
					WHERE o.id = q.id AND o.event_id = ANY ($2::uuid[])))
				AND ($3::text[] IS NULL OR q.record_key = ANY ($3::text[]))
			ORDER BY q.record_key, q.id LIMIT $4))
		  AND parked_at IS NOT NULL`
	// OutboxRetryNowSQL makes at most $2 pending rows backing off after $1
	// due at $1. They are read through outbox_pending_blocked_idx (almost
	// always empty; next_attempt_at > $1 implies its predicate); rows
	// another transaction holds (a relay's marks) are skipped, not waited
	// for. The outer conditions are checked again on a row changed
	// meanwhile (parked, published, or retried already).
	OutboxRetryNowSQL = `UPDATE {{table}}outbox_pending SET next_attempt_at = $1
		WHERE id = ANY (ARRAY(
			SELECT q.id FROM {{table}}outbox_pending q
			WHERE q.parked_at IS NULL AND q.next_attempt_at > $1
			LIMIT $2 FOR UPDATE SKIP LOCKED))
		  AND parked_at IS NULL AND next_attempt_at > $1`
	// OutboxLastPublishedSQL is the latest publication time, the last
	// entry of outbox_published_at_idx.
	OutboxLastPublishedSQL = `SELECT max(published_at) FROM {{table}}outbox_published`
	// OutboxRedriveSQL moves at most $4 rows published in [$1, $2) (of
	// the keys $3, if not NULL), the earliest published first (then the
	// lowest id), from published back to pending, with their failure
	// state cleared. The order is outbox_published_at_idx's: the rows a
	// batch moves leave the log, and the relays' republications of them
	// are stamped at or after $2, so each batch reads its own rows from
	// the index's front. (In id order, for which the log has no index,
	// each batch read and sorted the whole log: 200,000 rows took 25 s.)
	OutboxRedriveSQL = `WITH v AS (
			SELECT l.ctid, l.id, o.record_key
			FROM {{table}}outbox_published l JOIN {{table}}outbox o ON o.id = l.id
			WHERE l.published_at >= $1 AND l.published_at < $2
				AND ($3::text[] IS NULL OR o.record_key = ANY ($3::text[]))
			ORDER BY l.published_at, l.id LIMIT $4
			FOR UPDATE OF l SKIP LOCKED
		), d AS (
			DELETE FROM {{table}}outbox_published WHERE ctid = ANY (ARRAY(SELECT ctid FROM v)) RETURNING id)
		INSERT INTO {{table}}outbox_pending (id, record_key)
		SELECT v.id, v.record_key FROM v WHERE v.id IN (SELECT id FROM d)
		ON CONFLICT (id) DO NOTHING`
)

// Sagas.
const (
	SagaColumns = `saga_id, saga_type, state, data, created_at, updated_at, finished_at`

	SagaInsertSQL = `INSERT INTO {{table}}saga (` + SagaColumns + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (saga_id) DO NOTHING
		RETURNING ` + SagaColumns
	SagaGetSQL      = `SELECT ` + SagaColumns + ` FROM {{table}}saga WHERE saga_id = $1`
	SagaSetStateSQL = `UPDATE {{table}}saga
		SET state = $3, updated_at = $4, finished_at = $5
		WHERE saga_id = $1 AND state = ANY ($2::text[])
		RETURNING state`
	SagaStateSQL = `SELECT state FROM {{table}}saga WHERE saga_id = $1`
	// SagaStepInsertSQL records a step if the saga is, as last committed,
	// in the state $6 its kind requires, and returns the saga's state as it
	// stands once its row is locked FOR SHARE until the transaction ends
	// (so that SagaSetState waits for a step being recorded); no row when
	// nothing was inserted. The lock is taken after the INSERT, and only
	// when it inserted: a duplicate of a step an open transaction recorded
	// waits for that transaction on the primary key holding no lock on the
	// saga's row (the foreign key check takes FOR KEY SHARE, which a state
	// change does not wait for), so that transaction's own state change
	// (CompleteTx after the last step) does not wait for the duplicate,
	// which would wait for it: a deadlock. The lock waits for an
	// uncommitted state change and reads the state it left; a step
	// inserted under a state that changed meanwhile must be undone.
	SagaStepInsertSQL = `WITH ins AS (
			INSERT INTO {{table}}saga_step (saga_id, step_name, kind, result, completed_at)
			SELECT s.saga_id, $2, $3, $4, $5 FROM {{table}}saga s
			WHERE s.saga_id = $1 AND s.state = $6
			ON CONFLICT (saga_id, step_name) DO NOTHING
			RETURNING 1
		)
		SELECT s.state FROM {{table}}saga s
		WHERE s.saga_id = $1 AND EXISTS (SELECT 1 FROM ins)
		FOR SHARE OF s`
	// SagaStepReadSQL reads, when SagaStepInsertSQL inserted nothing, why:
	// the step's record (the transaction that committed it first), or the
	// saga's state. It locks nothing.
	SagaStepReadSQL = `SELECT s.state, st.saga_id IS NOT NULL, st.result
		FROM {{table}}saga s
		LEFT JOIN {{table}}saga_step st ON st.saga_id = s.saga_id AND st.step_name = $2
		WHERE s.saga_id = $1`
	// SagaStepDeleteSQL undoes a step SagaStepInsertSQL just recorded,
	// outside a savepoint, when the saga's state changed before the lock.
	SagaStepDeleteSQL = `DELETE FROM {{table}}saga_step WHERE saga_id = $1 AND step_name = $2`
	// The savepoint of a step recorded by StepTx (SagaStepRecordParams.Savepoint).
	SagaSavepointSQL         = `SAVEPOINT idem_saga_step`
	SagaReleaseSQL           = `RELEASE SAVEPOINT idem_saga_step`
	SagaRollbackSavepointSQL = `ROLLBACK TO SAVEPOINT idem_saga_step`
	SagaStepSetResultSQL     = `UPDATE {{table}}saga_step SET result = $3
		WHERE saga_id = $1 AND step_name = $2`
	SagaStepsSQL = `SELECT saga_id, step_name, kind, seq, result, completed_at
		FROM {{table}}saga_step WHERE saga_id = $1 ORDER BY seq`
	// SagaListSQL lists the sagas in the states $1, at most $2 (see
	// SagaListQuery).
	SagaListSQL = `SELECT ` + SagaColumns + ` FROM {{table}}saga
		WHERE state = ANY ($1::text[]) ORDER BY updated_at, saga_id LIMIT $2`
	// SagaListAfterSQL is SagaListSQL's next page, after ($3, $4).
	SagaListAfterSQL = `SELECT ` + SagaColumns + ` FROM {{table}}saga
		WHERE state = ANY ($1::text[]) AND (updated_at, saga_id) > ($3, $4::text)
		ORDER BY updated_at, saga_id LIMIT $2`
	// SagaListUnfinishedSQL and SagaListUnfinishedAfterSQL are
	// SagaListSQL and SagaListAfterSQL for states none of which is final:
	// finished_at IS NULL, which those states imply (the table's CHECK),
	// lets the planner read saga_unfinished_idx instead of every finished
	// saga the retention keeps.
	SagaListUnfinishedSQL = `SELECT ` + SagaColumns + ` FROM {{table}}saga
		WHERE state = ANY ($1::text[]) AND finished_at IS NULL ORDER BY updated_at, saga_id LIMIT $2`
	SagaListUnfinishedAfterSQL = `SELECT ` + SagaColumns + ` FROM {{table}}saga
		WHERE state = ANY ($1::text[]) AND finished_at IS NULL AND (updated_at, saga_id) > ($3, $4::text)
		ORDER BY updated_at, saga_id LIMIT $2`
)
