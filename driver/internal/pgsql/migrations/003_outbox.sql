-- older binaries: accept: a new table, which older binaries do not use.

-- Transactional outbox: events written in the business transaction and
-- published later by the relay (package outbox).
--
-- id orders the events of one record_key: the relay publishes a key's rows in
-- id order, one relay per key at a time (the key's oldest unpublished row is
-- locked with FOR UPDATE SKIP LOCKED while it is being published).
--
-- event_id is UNIQUE: a retried enqueue of the same business operation
-- (same envelope, same ID) is a no-op instead of a second event
-- (R-DIST-IDEM-X2).
--
-- next_attempt_at is NULL until the first failed publication (due at once);
-- parked_at is set when the relay gave up on a poison row: it stays, blocks
-- its own key, and is never deleted by cleanup.
CREATE TABLE {{table}}outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    event_id        uuid        NOT NULL,
    event_type      text        NOT NULL,
    record_key      text        NOT NULL,
    saga_id         text,
    payload         bytea       NOT NULL,
    headers         jsonb,
    occurred_at     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz,
    parked_at       timestamptz,
    CONSTRAINT {{name}}outbox_pkey PRIMARY KEY (id),
    CONSTRAINT {{name}}outbox_event_id_key UNIQUE (event_id)
);

-- The relay's scan: unpublished rows in id order (oldest first) ...
CREATE INDEX {{name}}outbox_pending_idx ON {{table}}outbox (id)
    WHERE published_at IS NULL;
-- ... and, per key, "is there an earlier unpublished row?" plus the rows
-- following a claimed head.
CREATE INDEX {{name}}outbox_pending_key_idx ON {{table}}outbox (record_key, id)
    WHERE published_at IS NULL;
-- Cleanup deletes published rows oldest first.
CREATE INDEX {{name}}outbox_published_at_idx ON {{table}}outbox (published_at)
    WHERE published_at IS NOT NULL;
