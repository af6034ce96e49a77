-- older binaries: refuse: it drops the index an older relay's claim reads a
-- key's pending rows through.

-- The relay reads pending rows in id order (outbox_pending_idx) and skips
-- the keys that are blocked: an earlier unpublished row of the key failed
-- and is backing off, or is parked. Those rows are in this index, which is
-- almost always empty, so the check is one probe per row.
CREATE INDEX {{table}}outbox_blocked_idx ON {{table}}outbox (record_key, id)
    WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL);

-- The per-key scan of the old claim is not needed any more.
DROP INDEX {{table}}outbox_pending_key_idx;
