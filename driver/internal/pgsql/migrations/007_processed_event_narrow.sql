-- older binaries: accept: same columns, same uniqueness, same conflict
-- inference (see below).

-- Inbox primary key with event_id first: (event_id, consumer_name), was
-- (consumer_name, event_id). Same columns, same uniqueness, same rows: an
-- event recorded before this migration is still a duplicate after it, and
-- INSERT ... ON CONFLICT (consumer_name, event_id) infers this key as
-- before (the inference does not depend on the column order).
--
-- Why: with the text column first, every comparison of an insertion's
-- descent went through the collation-aware text comparison and then had to
-- find the uuid behind a variable-length attribute; with the fixed-size
-- uuid first, it is a 16-byte comparison at a fixed offset, and the text is
-- compared only when the ids are equal (measured: about 20% less server
-- CPU per recorded event). The rows stay as they are; only the primary key
-- index is rebuilt, holding an exclusive lock on processed_event meanwhile
-- (a few seconds per million rows). On a partitioned processed_event
-- (pgdriver's EnableInboxPartitioning) the key is rebuilt on every
-- partition; it still contains the partition key event_id.
ALTER TABLE {{table}}processed_event
    DROP CONSTRAINT {{name}}processed_event_pkey,
    ADD CONSTRAINT {{name}}processed_event_pkey PRIMARY KEY (event_id, consumer_name);
