-- older binaries: refuse: the first migration: no binary predates it.

-- HTTP idempotency records (R-DIST-IDEM-3). One row per (scope, key).
CREATE TABLE {{table}}idempotency_record (
    scope            text        NOT NULL,
    idempotency_key  text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    state            text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    http_status      integer,
    headers          bytea,
    body             bytea,
    lease_token      text,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    CONSTRAINT {{name}}idempotency_record_pkey PRIMARY KEY (scope, idempotency_key)
);

CREATE INDEX {{name}}idempotency_record_expires_at_idx ON {{table}}idempotency_record (expires_at);
