-- older binaries: refuse: an older relay's claim cannot use the new
-- outbox_pending_idx (it leaves held rows out), and scans the outbox.

-- Rows held behind a parked row of their key.
--
-- A parked row blocks the later rows of its key until an operator unparks
-- it, and the key's events go on being enqueued meanwhile: its backlog
-- grows for as long as the park lasts. The relay's claim walks the pending
-- rows in id order (outbox_pending_idx) and read that whole backlog, row
-- by row, before the claimable rows after it: 0.5 s a claim for 200,000.
--
-- held = 1 marks those rows: set on the rows of a key that come after one
-- of its parked rows, by the trigger below for those there when it is
-- parked (whoever parks it: the relay, or an operator's SQL), and by the
-- driver's enqueue for those enqueued while it stays parked (one probe of
-- outbox_blocked_idx per row; a trigger cost 2 us per row on every
-- enqueue). A row inserted another way is not held: claims read it, as
-- before. The pending index leaves held rows
-- out; they are in outbox_held_idx, by key, where a claim skips a key
-- still blocked in one probe. held is never cleared: once its key is
-- unblocked (unparked, by any means), a held row is claimed through
-- outbox_held_idx, in order with the others, and leaves the index when it
-- is published. held is a shortcut, never the rule: a claim checks every
-- row it returns against the parked and backing-off rows of its key, as
-- before.
ALTER TABLE {{table}}outbox ADD COLUMN held INTEGER NOT NULL DEFAULT 0;

UPDATE {{table}}outbox SET held = 1
WHERE published_at IS NULL
  AND EXISTS (SELECT 1 FROM {{table}}outbox b
    WHERE b.record_key = {{table}}outbox.record_key AND b.id < {{table}}outbox.id
      AND b.published_at IS NULL AND (b.parked_at IS NOT NULL OR b.next_attempt_at IS NOT NULL)
      AND b.parked_at IS NOT NULL);

DROP INDEX {{table}}outbox_pending_idx;
CREATE INDEX {{table}}outbox_pending_idx ON {{table}}outbox (id)
    WHERE published_at IS NULL AND held = 0;
CREATE INDEX {{table}}outbox_held_idx ON {{table}}outbox (record_key, id)
    WHERE published_at IS NULL AND held = 1;

-- A row parked holds the later pending rows of its key (read through
-- outbox_pending_idx from the parked row on: once per park).
CREATE TRIGGER {{table}}outbox_hold_parked AFTER UPDATE OF parked_at ON {{table}}outbox
WHEN NEW.parked_at IS NOT NULL AND OLD.parked_at IS NULL AND NEW.published_at IS NULL
BEGIN
    UPDATE {{table}}outbox SET held = 1
    WHERE published_at IS NULL AND held = 0 AND id > NEW.id AND record_key = NEW.record_key;
END;
