-- older binaries: accept: new tables, which older binaries do not use.

-- Sagas (package saga, rule R-DIST-IDEM-1: a saga step is identified by
-- sagaId + stepName).
--
-- saga holds one row per saga with its state. finished_at is set exactly
-- when the saga reached a final state (completed, compensated); the cleaner
-- deletes finished sagas by it. A failed saga (a compensation kept failing)
-- is not finished: it waits for Compensate to be called again.
CREATE TABLE {{table}}saga (
    saga_id     text        NOT NULL CHECK (saga_id <> ''),
    saga_type   text        NOT NULL,
    state       text        NOT NULL
        CHECK (state IN ('running', 'completed', 'compensating', 'compensated', 'failed')),
    data        bytea,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    finished_at timestamptz,
    CONSTRAINT {{name}}saga_pkey PRIMARY KEY (saga_id),
    CONSTRAINT {{name}}saga_finished_check
        CHECK ((finished_at IS NOT NULL) = (state IN ('completed', 'compensated')))
);

-- The cleaner deletes finished sagas oldest first.
CREATE INDEX {{name}}saga_finished_at_idx ON {{table}}saga (finished_at)
    WHERE finished_at IS NOT NULL;
-- A recovery loop lists unfinished sagas by state (compensating, failed).
CREATE INDEX {{name}}saga_unfinished_idx ON {{table}}saga (state, updated_at)
    WHERE finished_at IS NULL;

-- saga_step holds one row per completed step, forward or compensation
-- (named 'compensate:' || the forward step's name). The row is inserted with
-- INSERT ... ON CONFLICT DO NOTHING in the transaction of the step's effect:
-- a retried or redelivered step finds it and is skipped. seq orders the
-- steps of a saga by the time they were recorded (compensations run in
-- reverse seq order of the forward steps).
CREATE TABLE {{table}}saga_step (
    saga_id      text        NOT NULL,
    step_name    text        NOT NULL CHECK (step_name <> ''),
    kind         text        NOT NULL CHECK (kind IN ('forward', 'compensation')),
    seq          bigint      GENERATED ALWAYS AS IDENTITY,
    result       bytea,
    completed_at timestamptz NOT NULL,
    CONSTRAINT {{name}}saga_step_pkey PRIMARY KEY (saga_id, step_name),
    CONSTRAINT {{name}}saga_step_saga_fkey FOREIGN KEY (saga_id)
        REFERENCES {{table}}saga (saga_id) ON DELETE CASCADE
);
