-- older binaries: accept: new tables, which older binaries do not use.

-- Sagas (package saga, rule R-DIST-IDEM-1: a saga step is identified by
-- sagaId + stepName). Times are Unix microseconds (UTC).
--
-- saga holds one row per saga with its state. finished_at is set exactly
-- when the saga reached a final state (completed, compensated); the cleaner
-- deletes finished sagas by it. A failed saga (a compensation kept failing)
-- is not finished: it waits for Compensate to be called again.
CREATE TABLE {{table}}saga (
    saga_id     TEXT    NOT NULL PRIMARY KEY CHECK (saga_id <> ''),
    saga_type   TEXT    NOT NULL,
    state       TEXT    NOT NULL
        CHECK (state IN ('running', 'completed', 'compensating', 'compensated', 'failed')),
    data        BLOB,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    finished_at INTEGER,
    CHECK ((finished_at IS NOT NULL) = (state IN ('completed', 'compensated')))
) WITHOUT ROWID;

-- The cleaner deletes finished sagas oldest first.
CREATE INDEX {{table}}saga_finished_at_idx ON {{table}}saga (finished_at)
    WHERE finished_at IS NOT NULL;
-- A recovery loop lists unfinished sagas by state (compensating, failed).
CREATE INDEX {{table}}saga_unfinished_idx ON {{table}}saga (state, updated_at)
    WHERE finished_at IS NULL;

-- saga_step holds one row per completed step, forward or compensation
-- (named 'compensate:' || the forward step's name). The row is inserted with
-- INSERT ... ON CONFLICT DO NOTHING in the transaction of the step's effect:
-- a retried or redelivered step finds it and is skipped. seq numbers the
-- steps of a saga 1, 2, ... in the order they were recorded (SQLite
-- serialises writers, so the numbering is exact).
CREATE TABLE {{table}}saga_step (
    saga_id      TEXT    NOT NULL REFERENCES {{table}}saga (saga_id) ON DELETE CASCADE,
    step_name    TEXT    NOT NULL CHECK (step_name <> ''),
    kind         TEXT    NOT NULL CHECK (kind IN ('forward', 'compensation')),
    seq          INTEGER NOT NULL,
    result       BLOB,
    completed_at INTEGER NOT NULL,
    PRIMARY KEY (saga_id, step_name)
) WITHOUT ROWID;

-- Deleting a saga deletes its steps, also on a connection opened without
-- PRAGMA foreign_keys (sqlitedriver.New on the application's *sql.DB).
CREATE TRIGGER {{table}}saga_delete_steps AFTER DELETE ON {{table}}saga
BEGIN
    DELETE FROM {{table}}saga_step WHERE saga_id = OLD.saga_id;
END;
