// Package cleanup deletes what idem's tables no longer need, off the hot
// path, in small batches, on a schedule, with exactly one replica sweeping
// at a time (rule R-DIST-IDEM-5, docs/rules.md).
//
//	c, err := cleanup.New(drv, &cleanup.Config{
//		Inbox: cleanup.InboxRetention{RedeliveryHorizon: 72 * time.Hour}, // the topic's retention; a longer one than the TTL (72h) is refused
//	})
//	if err != nil { ... } // a misconfiguration fails at start-up
//	go c.Run(ctx)         // daily at 03:00; c.RunOnce(ctx) sweeps now
//
// # Retention rules
//
//   - idempotency_record: a record deduplicates until its expires_at, which
//     the writer sets (idemhttp.Config.TTL: 24h by default, 24h..72h unless
//     overridden with a reason). The cleaner deletes the records whose
//     expires_at has passed, never a live one (an in-progress record of a
//     handler running longer than the TTL has expired too); readers already
//     treat expired records as absent, so a late sweep never extends a
//     record's life. Expiry is judged by the database's clock (the default
//     Config.Now, see docs/retention.md).
//   - processed_event (the inbox): a row is kept for Config.Inbox.TTL after
//     processed_at, 72h by default. Like idempotency records it must stay
//     within 24h..72h unless Config.Inbox.OverrideReason says why: shorter,
//     and a redelivery after the row is gone applies the event twice; longer,
//     and the table grows for nothing. The window must also cover the
//     topic's redelivery horizon (its retention, or the largest consumer lag
//     you tolerate): an event redelivered after its dedup row was deleted is
//     applied twice. Set Config.Inbox.RedeliveryHorizon and New refuses a
//     TTL shorter than it. The TTL applies to every consumer.
//   - outbox: published rows are kept for Config.Outbox.TTL after their
//     publication (24h by default) for audits and manual republishing
//     (outbox.Redrive). Rows not yet published, and parked rows, are never
//     deleted. (With pgdriver.Config.OutboxDeletePublished the relay
//     deletes rows as it publishes them, and there is nothing to sweep.)
//   - saga and saga_step (package saga): a saga that finished (completed
//     or compensated) is deleted with its steps Config.Sagas.TTL after its
//     finished_at, 72h by default; less than 24h needs
//     Config.Sagas.OverrideReason. Running, compensating and failed sagas
//     are never deleted: they are work in progress. Keep finished sagas at
//     least as long as the inbox keeps their events (New warns otherwise):
//     a late event of a deleted saga finds no saga, or starts it again.
//   - an application's own tables are added as Config.Rules, swept after
//     the built-in ones.
//
// A row exactly as old as its TTL is kept; an idempotency record whose
// expires_at equals now is deleted (it is already treated as absent).
//
// # Batches
//
// Every DELETE removes at most Config.BatchSize rows (1000 by default;
// oldest first; for sagas, BatchSize sagas with their steps; on PostgreSQL
// rows held by a concurrent transaction are skipped, never waited for), and
// a table is swept again after Config.Pause (50ms) until a batch deletes
// fewer rows. So a sweep never holds many row locks, never holds them for
// long, and leaves room to the application's inserts and to replication.
// When the context is cancelled the running statement is cancelled and the
// sweep stops.
//
// Each batch of a built-in table resumes after the key of the last row the
// batch before it deleted (driver.DeleteResult), so that it reads the
// table's retention index from there: on PostgreSQL, while another
// transaction holds an old snapshot, the entries of the rows deleted by
// the earlier batches stay in the index, and a batch reading it from the
// start would walk over all of them. Each sweep starts from the oldest row;
// a row that becomes eligible behind the cursor during a sweep is left for
// the next one. A Rule's Delete is called without a cursor.
//
// # Replicas
//
// A sweep first takes the lease Config.LockName ("idem-cleanup") in the
// idem_lock table, one INSERT ... ON CONFLICT statement that succeeds for
// exactly one replica. The others report Skipped. Taking the lease, and
// each renewal, gets Config.Lease/3: one sent on a connection that stopped
// answering (a network partition that closes nothing) fails the sweep, or
// that renewal, then. The holder renews the
// lease every Config.Lease/3 while it sweeps (a failed renewal is retried
// after 100ms, doubling up to Lease/3) and stops when it learns the
// lease was taken over (a replica stalled past its lease), or when it
// expires unrenewed. After a completed
// sweep it keeps the lease for Config.Hold (1m), so replicas woken by the same
// schedule a little later skip that run instead of sweeping again. A dead
// replica's lease expires after Config.Lease and the next sweep takes over.
//
// # PostgreSQL partition mode
//
// At very high event rates, deleting millions of inbox rows a day costs more
// than it should: every DELETE writes WAL and dead tuples, autovacuum must
// then reclaim them, and the table and its indexes bloat between vacuums. In
// partition mode processed_event is range-partitioned on its UUIDv7
// event_id, one partition per UTC day (bounds computed from the day's
// timestamps: the 48-bit millisecond prefix followed by zeros), and a whole
// expired day is removed with DETACH PARTITION + DROP TABLE: no dead tuples,
// no vacuum, a constant cost whatever the day's size.
//
// Choose it when the inbox takes on the order of a million rows a day or
// more, or when the DELETE sweep's WAL and vacuum load shows up next to the
// application's; stay with the default DELETE mode otherwise: it needs no
// DDL and works on every backend. Partition mode needs PostgreSQL, event ids
// that are UUIDv7 (idem's event package makes them), and brief exclusive
// locks on processed_event when a day is detached (bounded by
// pgdriver.PartitionLockTimeout; a sweep that cannot get them tries again
// next time). Creating a day's partition holds an exclusive lock on the
// DEFAULT partition while it scans it (twice: to move the day's rows, then
// to attach), so inserts that land there wait for as long as the scan
// takes: keep the DEFAULT partition small (UUIDv7 event ids keep it
// nearly empty as long as sweeps succeed: when none has for more than
// PartitionsAhead days, every new event lands in it, and the next sweep
// moves the whole day under that lock; alert on failed sweeps).
//
// To enable it, call the driver's EnableInboxPartitioning once after
// Migrate (it converts the table in one transaction, copying its rows), then
// set Config.PartitionedInbox. Each sweep then creates the partitions of the
// next Config.PartitionsAhead days (3; New refuses a Schedule whose sweeps
// are further apart, such as a weekly one), drops the days that ended before
// now - Inbox.TTL, and deletes the old rows of the DEFAULT partition in
// batches. The default partition takes the ids that are not UUIDv7 and the
// ids of days without a partition. A dropped day's rows that were processed
// within the TTL (events consumed long after they were created) are moved to
// the default partition first, so partition mode keeps every row the DELETE
// mode would keep; it keeps some rows longer, up to the end of their id's
// day. That copy runs under the exclusive lock of the detach, so a day with
// more than pgdriver.PartitionRescueMax (1000) such rows (a consumer that
// caught up on a long backlog) is kept whole instead, and dropped by a later
// sweep once they are older than the TTL.
package cleanup
