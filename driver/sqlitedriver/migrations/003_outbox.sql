-- older binaries: accept: a new table, which older binaries do not use.

-- Transactional outbox: events written in the business transaction and
-- published later by the relay (package outbox). Times are Unix microseconds
-- (UTC); event_id is the canonical lower-case UUID text.
--
-- id orders the events of one record_key: the relay publishes a key's rows in
-- id order. SQLite has no row locks: one relay per database.
--
-- event_id is UNIQUE: a retried enqueue of the same business operation
-- (same envelope, same ID) is a no-op instead of a second event
-- (R-DIST-IDEM-X2).
--
-- next_attempt_at is NULL until the first failed publication (due at once);
-- parked_at is set when the relay gave up on a poison row: it stays, blocks
-- its own key, and is never deleted by cleanup.
CREATE TABLE {{table}}outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT    NOT NULL UNIQUE CHECK (length(event_id) = 36),
    event_type      TEXT    NOT NULL,
    record_key      TEXT    NOT NULL,
    saga_id         TEXT,
    payload         BLOB    NOT NULL,
    headers         TEXT,
    occurred_at     INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    published_at    INTEGER,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at INTEGER,
    parked_at       INTEGER
);

-- The relay's scan: unpublished rows in id order (oldest first) ...
CREATE INDEX {{table}}outbox_pending_idx ON {{table}}outbox (id)
    WHERE published_at IS NULL;
-- ... and, per key, "is there an earlier unpublished row?" plus the
-- rows following a claimed head.
CREATE INDEX {{table}}outbox_pending_key_idx ON {{table}}outbox (record_key, id)
    WHERE published_at IS NULL;
-- Cleanup deletes published rows oldest first.
CREATE INDEX {{table}}outbox_published_at_idx ON {{table}}outbox (published_at)
    WHERE published_at IS NOT NULL;
