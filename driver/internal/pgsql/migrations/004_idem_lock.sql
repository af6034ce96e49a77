-- older binaries: accept: a new table, which older binaries do not use.

-- Named leases (driver.LockExecutor): with several replicas, the one whose
-- owner is stored here runs the job called name (the cleanup sweep takes
-- "idem-cleanup"); the others skip. A lease whose expires_at has passed may
-- be taken over in one INSERT ... ON CONFLICT DO UPDATE statement.
CREATE TABLE {{table}}idem_lock (
    name       text        NOT NULL,
    owner      text        NOT NULL CHECK (owner <> ''),
    expires_at timestamptz NOT NULL,
    CONSTRAINT {{name}}idem_lock_pkey PRIMARY KEY (name)
);
