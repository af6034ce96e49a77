-- older binaries: accept: a new table, which older binaries do not use.

-- Consumer inbox (R-DIST-IDEM-2): one row per event a consumer has applied,
-- inserted with INSERT ... ON CONFLICT DO NOTHING in the transaction of the
-- business effect.
--
-- The key is (consumer_name, event_id), not event_id alone: idem
-- deduplicates per consumer, so the same event is applied once by each
-- consumer (a projection and a notifier sharing a database both see it).
CREATE TABLE {{table}}processed_event (
    event_id      uuid        NOT NULL,
    consumer_name text        NOT NULL CHECK (consumer_name <> ''),
    processed_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{name}}processed_event_pkey PRIMARY KEY (consumer_name, event_id)
);

-- Cleanup deletes the oldest rows first (R-DIST-IDEM-5).
CREATE INDEX {{name}}processed_event_processed_at_idx ON {{table}}processed_event (processed_at);
