-- older binaries: accept: a new table, which older binaries do not use.

-- Named leases (driver.LockExecutor): with several replicas, the one whose
-- owner is stored here runs the job called name (the cleanup sweep takes
-- "idem-cleanup"); the others skip. expires_at is Unix microseconds (UTC).
CREATE TABLE {{table}}idem_lock (
    name       TEXT    NOT NULL PRIMARY KEY,
    owner      TEXT    NOT NULL CHECK (owner <> ''),
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
