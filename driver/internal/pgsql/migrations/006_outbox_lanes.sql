-- older binaries: refuse: an older relay claims a key through the index
-- dropped here, without the lane locks the newer relays take: the two would
-- not exclude each other on a key.

-- Outbox lanes: every row belongs to one of 64 lanes, a fixed hash of its
-- record_key (hashtextextended is immutable, and stable across PostgreSQL
-- versions because hash partitioning depends on it), so all the rows of one
-- key are in one lane. A relay owns a lane while it publishes from it
-- (a transaction-scoped advisory lock, see pgdriver's OutboxClaimBatch) and
-- reads the lane's pending rows in id order with a plain range scan of
-- outbox_lane_idx: the cost of a claim does not depend on how many keys are
-- pending nor on how long one key's backlog is.
--
-- Adding the generated column rewrites the table once; existing rows get
-- their lane with it.
ALTER TABLE {{table}}outbox
    ADD COLUMN lane smallint NOT NULL
    GENERATED ALWAYS AS ((abs(hashtextextended(record_key, 0) % 64))::smallint) STORED;

-- Parked rows are left out: a lane whose only pending rows are parked is
-- not worth a claim (the parked row still blocks its key: see below).
CREATE INDEX {{name}}outbox_lane_idx ON {{table}}outbox (lane, id)
    WHERE published_at IS NULL AND parked_at IS NULL;

-- Rows that failed at least once (backing off or parked) and are still
-- unpublished: they block the later rows of their key. Almost always empty,
-- so "is this key blocked?" is one probe of an empty index.
CREATE INDEX {{name}}outbox_blocked_idx ON {{table}}outbox (record_key, id)
    WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL);

-- The planner must read one lane through outbox_lane_idx, whatever the
-- statistics say: with one busy key nearly every row is in one lane, and a
-- plan made for "lane = $1" would then scan the whole table for each of the
-- other lanes. Pin the number of distinct lanes.
ALTER TABLE {{table}}outbox ALTER COLUMN lane SET (n_distinct = 64);
ANALYZE {{table}}outbox;

-- The per-key scan of the old claim is not needed any more.
DROP INDEX {{table}}outbox_pending_key_idx;
