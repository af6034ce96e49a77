-- older binaries: accept: a new table, which older binaries do not use.

-- Consumer inbox (R-DIST-IDEM-2): one row per event a consumer has applied,
-- inserted with INSERT ... ON CONFLICT DO NOTHING in the transaction of the
-- business effect. event_id is the canonical lower-case UUID text;
-- processed_at is Unix microseconds (UTC).
--
-- The key is (consumer_name, event_id), not event_id alone: idem
-- deduplicates per consumer, so the same event is applied once by each
-- consumer.
CREATE TABLE {{table}}processed_event (
    event_id      TEXT    NOT NULL CHECK (length(event_id) = 36),
    consumer_name TEXT    NOT NULL CHECK (consumer_name <> ''),
    processed_at  INTEGER NOT NULL,
    PRIMARY KEY (consumer_name, event_id)
) WITHOUT ROWID;

-- Cleanup deletes the oldest rows first (R-DIST-IDEM-5).
CREATE INDEX {{table}}processed_event_processed_at_idx ON {{table}}processed_event (processed_at);
