-- older binaries: refuse: an older relay fails against it and publishes
-- nothing (see below).

-- Outbox delivery state in two narrow tables of its own; the outbox row is
-- written once, when enqueued, and never updated.
--
--   outbox             the event as enqueued (id, event_id, payload, ...)
--   outbox_pending     one row per event not yet published: its key, lane,
--                      and failure state (attempts, last_error,
--                      next_attempt_at, parked_at). The relay reads its
--                      lanes here and deletes the row once the event is
--                      published.
--   outbox_published   one row per published event: (id, published_at).
--                      Cleanup and redrive select by publication time here.
--
-- Why: marking a batch published used to UPDATE the wide outbox row, which
-- writes a new version of the row (payload included) and of each of its
-- index entries: 62% of the relay's statement time at 1,000 keys. Deleting
-- a narrow pending row and appending a narrow log row costs a third to a
-- quarter of that per event.
--
-- Invariants kept by the drivers' statements (there are no foreign keys:
-- one would cost an index probe per row on the hot paths): an outbox row is
-- in outbox_pending until it is published, then in outbox_published until
-- cleanup deletes both; never in both. An event is unpublished exactly when
-- its id is in outbox_pending.
--
-- The move below keeps every row: unpublished ones (parked and backing off
-- included, with their attempts and errors) become pending rows, published
-- ones keep their publication time. It holds an exclusive lock on outbox
-- while it runs (enqueues wait): 1.4 s for 1,010,000 rows (10,000 of them
-- pending) on a 2-core test machine. During a rolling upgrade, replicas of
-- an earlier release can go on enqueueing (the trigger below gives their
-- events pending rows); their relays fail on the columns dropped here, and
-- publish nothing, until they are replaced.
--
-- The lock comes first: each statement below reads outbox with a snapshot
-- of its own, so an event an earlier release enqueued in a transaction
-- that commits after the move's snapshot, and before the trigger exists,
-- would get neither a pending row nor a publication row, and would never be
-- published. Taken first, the lock waits for such transactions to end, and
-- makes enqueues wait until the migration commits.
LOCK TABLE {{table}}outbox IN ACCESS EXCLUSIVE MODE;

CREATE TABLE {{table}}outbox_pending (
    id              bigint      NOT NULL,
    record_key      text        NOT NULL,
    -- The lane of the key (see migration 006), computed as before.
    lane            smallint    NOT NULL
        GENERATED ALWAYS AS ((abs(hashtextextended(record_key, 0) % 64))::smallint) STORED,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz,
    parked_at       timestamptz,
    CONSTRAINT {{name}}outbox_pending_pkey PRIMARY KEY (id)
);

INSERT INTO {{table}}outbox_pending (id, record_key, attempts, last_error, next_attempt_at, parked_at)
SELECT id, record_key, attempts, last_error, next_attempt_at, parked_at
FROM {{table}}outbox WHERE published_at IS NULL;

CREATE TABLE {{table}}outbox_published (
    id           bigint      NOT NULL,
    published_at timestamptz NOT NULL
);

INSERT INTO {{table}}outbox_published (id, published_at)
SELECT id, published_at FROM {{table}}outbox WHERE published_at IS NOT NULL;

-- The old indexes on the delivery state go with the columns.
DROP INDEX {{table}}outbox_pending_idx;
DROP INDEX {{table}}outbox_published_at_idx;
DROP INDEX {{table}}outbox_lane_idx;
DROP INDEX {{table}}outbox_blocked_idx;
ALTER TABLE {{table}}outbox
    DROP COLUMN lane,
    DROP COLUMN published_at,
    DROP COLUMN attempts,
    DROP COLUMN last_error,
    DROP COLUMN next_attempt_at,
    DROP COLUMN parked_at;

-- A lane's claimable rows in id order (parked rows left out, as before).
CREATE INDEX {{name}}outbox_pending_lane_idx ON {{table}}outbox_pending (lane, id)
    WHERE parked_at IS NULL;
-- Rows that failed at least once: they block the later rows of their key.
-- Almost always empty.
CREATE INDEX {{name}}outbox_pending_blocked_idx ON {{table}}outbox_pending (record_key, id)
    WHERE parked_at IS NOT NULL OR next_attempt_at IS NOT NULL;
-- Cleanup and redrive, oldest publication first.
CREATE INDEX {{name}}outbox_published_at_idx ON {{table}}outbox_published (published_at);

-- Every event inserted into outbox gets its pending row from this trigger,
-- once per statement (the inserted rows as a transition table), whoever
-- inserts it: idem's drivers, an operator's SQL, or a replica of an
-- earlier release still running during a rolling upgrade. Were the pending
-- row written by the drivers' statement instead, an event inserted any
-- other way would never be published, silently. The function keeps the
-- search_path of this migration (SET ... FROM CURRENT): without a
-- configured schema, the table names below are resolved through it, and an
-- insert from a session with another search_path must still find them.
CREATE FUNCTION {{table}}outbox_pending_insert() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO {{table}}outbox_pending (id, record_key)
    SELECT id, record_key FROM idem_inserted;
    RETURN NULL;
END
$$;
CREATE TRIGGER {{name}}outbox_pending_insert AFTER INSERT ON {{table}}outbox
    REFERENCING NEW TABLE AS idem_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {{table}}outbox_pending_insert();

-- And an event deleted from outbox (by cleanup, or by an operator dropping
-- events in SQL) takes its pending row with it; TRUNCATE of outbox empties
-- the other two tables (truncate all three at once to skip their DELETE). A pending row left without its event would be
-- read by every claim of its lane and published never, and enough of them
-- at the head of a lane would stop the lane. (A publication log row left
-- without its event is harmless: cleanup deletes it in its turn.)
CREATE FUNCTION {{table}}outbox_pending_delete() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        -- DELETE, not TRUNCATE: a TRUNCATE of the three tables in one
        -- statement has them open, and a nested TRUNCATE would fail.
        DELETE FROM {{table}}outbox_pending;
        DELETE FROM {{table}}outbox_published;
    ELSE
        DELETE FROM {{table}}outbox_pending p USING idem_deleted d WHERE p.id = d.id;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER {{name}}outbox_pending_delete AFTER DELETE ON {{table}}outbox
    REFERENCING OLD TABLE AS idem_deleted
    FOR EACH STATEMENT EXECUTE FUNCTION {{table}}outbox_pending_delete();
CREATE TRIGGER {{name}}outbox_truncate AFTER TRUNCATE ON {{table}}outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {{table}}outbox_pending_delete();

-- As in migration 006: a lane is read through the lane index whatever the
-- statistics say.
ALTER TABLE {{table}}outbox_pending ALTER COLUMN lane SET (n_distinct = 64);
ANALYZE {{table}}outbox_pending;
ANALYZE {{table}}outbox_published;
