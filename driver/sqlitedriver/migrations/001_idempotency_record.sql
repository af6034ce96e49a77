-- older binaries: refuse: the first migration: no binary predates it.

-- HTTP idempotency records (R-DIST-IDEM-3). One row per (scope, key).
-- Times are Unix microseconds (UTC).
CREATE TABLE {{table}}idempotency_record (
    scope            TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
    http_status      INTEGER,
    headers          BLOB,
    body             BLOB,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    PRIMARY KEY (scope, idempotency_key)
) WITHOUT ROWID;

CREATE INDEX {{table}}idempotency_record_expires_at_idx ON {{table}}idempotency_record (expires_at);
