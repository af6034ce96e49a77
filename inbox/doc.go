// Package inbox makes a consumer apply each event once, however often it is
// delivered (rule R-DIST-IDEM-2, docs/rules.md). Every delivery path is
// at-least-once (a consumer-group rebalance, a lost offset commit, a
// producer retry); the inbox turns that into an effect applied exactly once.
//
//	ib, err := inbox.New(drv, &inbox.Config{Consumer: "order-projection"})
//	applied, err := ib.Process(ctx, env.ID, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, `INSERT INTO order_view ...`) // the effect, in tx
//		return err
//	})
//	// err == nil: the event is applied (applied) or was already (!applied);
//	// now, and only now, commit the Kafka offset.
//
// # How
//
// Process opens a transaction, records (consumer, event ID) in the table
// processed_event with INSERT ... ON CONFLICT DO NOTHING and, only if that
// inserted a row, calls the handler with the same transaction, then commits
// both. There is no SELECT before the INSERT, so there is no window between a
// check and a write (TOCTOU). The package never commits behind the caller's
// back: ProcessTx, ProcessBatchTx and ProcessBulkTx join a transaction the
// caller owns.
//
// # Guarantees
//
//   - One effect per (consumer, event ID). A duplicate (redelivery, retry,
//     replay of a partition) returns applied == false without calling the
//     handler and without writing anything.
//   - The dedup row and the effect commit together or not at all. A handler
//     error, a panic, a killed connection or a crashed process before COMMIT
//     leaves neither, so the next delivery applies the event. A handler error
//     is returned as an *EventError wrapping it; nothing is cached about it.
//   - Concurrent duplicates apply once. On PostgreSQL a second transaction
//     inserting the same key waits on the primary key for the first: if the
//     first commits, the second skips; if it rolls back, the second applies.
//     SQLite serialises writers, with the same outcome.
//   - Each consumer is separate: the key is (consumer_name, event_id). A
//     table keyed by event_id alone would let only one consumer of a
//     database ever process a given event; idem deliberately
//     deduplicates per consumer, so a projection and a notifier sharing a
//     database each apply the event once.
//   - A batch (ProcessBatch) is one transaction and one INSERT for all its
//     IDs (on PostgreSQL a batch of 8 or more IDs is first inserted without
//     ON CONFLICT, which is cheaper, in a savepoint; only a batch that holds
//     an already processed ID is inserted again with ON CONFLICT DO NOTHING:
//     see pgdriver's InboxInsert). The handler runs for the new events
//     only, in input order; a later copy of an ID within the batch counts
//     as a duplicate. If the handler fails on one event, the whole batch
//     rolls back and the *EventError names the event (ID and index), so
//     the caller can retry the batch or dead-letter that event. IDs are
//     inserted in sorted order, so overlapping batches of concurrent
//     consumers cannot deadlock.
//   - A bulk batch (ProcessBulk, ProcessBulkTx) is the same single
//     transaction and INSERT, but the handler runs ONCE with all the new
//     events of the batch (duplicates removed, input order), so it can
//     write their effects with one statement too. If it fails, the whole
//     batch rolls back and the *BulkError cannot name an event: apply the
//     events one at a time to find the one at fault.
//
// # Which form
//
// Process handles one event per transaction: the simplest, and right for a
// low rate. ProcessBatch amortises the transaction and the dedup INSERT
// over a batch (a Kafka poll), but the handler still costs a round trip per
// event, which bounds the throughput. ProcessBulk removes that last round
// trip when the effect of many events can be written at once (a multi-row
// INSERT ... SELECT FROM unnest(...), COPY into a staging table): a
// projection or an append-only log then applies a batch in a constant
// number of statements. Its price is the error: a failing batch must be
// replayed event by event to isolate the culprit (package idemkafka does
// that for its BatchHandler).
//
// # What the caller must do
//
//   - Write the effect through the transaction the handler receives, and
//     only through it. On SQLite this is also a necessity: the driver has a
//     single connection, so a second transaction would wait forever.
//   - Commit the broker offset only after Process, ProcessBatch or
//     ProcessBulk returned nil. A failed call (including a failed COMMIT,
//     whose outcome is unknown) must lead to a redelivery, never to a
//     skipped event; redelivering is always safe.
//   - Keep the event ID stable across redeliveries: it comes from the
//     producer, generated once per business operation (package event).
//   - After ProcessTx, ProcessBatchTx or ProcessBulkTx returned an error,
//     roll the transaction back: it holds the dedup rows of events whose
//     effect failed.
//   - Keep processed_event rows at least as long as an event can be
//     redelivered (broker retention, the longest consumer lag, a replay
//     window). Once the cleanup deleted an event's row, a redelivery of it
//     is applied again. The driver's executor tells how far back the table
//     reaches: drv.Executor().InboxOldest(ctx).
//
// Effects outside the database (an HTTP call, a produced message) are not
// covered: they may happen again when a transaction rolls back. Produce
// follow-up events through the outbox, in the same transaction.
package inbox
