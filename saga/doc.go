// Package saga runs the steps of long business processes (an order that
// reserves stock, charges a card and books a courier) exactly once each,
// and undoes the completed ones, in reverse order, when a later step fails
// for good (rule R-DIST-IDEM-1: a saga step is identified by sagaId +
// stepName; every step and every compensation must be idempotent, because
// the saga retries them).
//
//	sagas, err := saga.New(drv, nil)
//
//	// In the consumer of OrderCreated: start the saga and run its first
//	// step, in the transaction of the inbox.
//	_, err = ib.ProcessTx(ctx, tx, env.ID, func(ctx context.Context, tx pgx.Tx) error {
//		if _, _, err := sagas.StartTx(ctx, tx, orderID, "order", env.Payload); err != nil {
//			return err
//		}
//		_, _, err := sagas.StepTx(ctx, tx, orderID, "reserve-stock", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
//			resID, err := reserveStock(ctx, tx, order) // the effect, through tx
//			if err != nil {
//				return nil, err
//			}
//			ev, _ := event.New("StockReserved.v1", orderID, reservation)
//			if _, err := sagas.EmitTx(ctx, tx, orderID, "reserve-stock", "", ev); err != nil {
//				return nil, err
//			}
//			return []byte(resID), nil // the step's result, kept for its compensation
//		})
//		return err
//	})
//	// commit tx, then the Kafka offset
//
//	// In the consumer of PaymentFailed: stop the saga in the inbox's
//	// transaction, then, after the commit, undo what was done.
//	err = sagas.AbortTx(ctx, tx, orderID) // commit tx
//	err = sagas.Compensate(ctx, orderID, saga.Compensations[pgx.Tx]{
//		"reserve-stock": func(ctx context.Context, tx pgx.Tx, fwd saga.StepRecord) ([]byte, error) {
//			return nil, releaseStock(ctx, tx, string(fwd.Result))
//		},
//		"validate-order": nil, // nothing to undo
//	})
//
// Names follow one rule, as in every idem package: a method ending in Tx
// (StartTx, StepTx, EmitTx, CompleteTx, AbortTx, GetTx) joins the caller's
// transaction and never commits it (a nil transaction, one not threaded
// through, is refused with an error: nothing is written); the same name
// without Tx (Step, Get, Compensate, Resume) opens and commits transactions
// of its own.
//
// # Guarantees
//
//   - One effect per step. StepTx records (sagaID, stepName) in the table
//     saga_step with INSERT ... ON CONFLICT DO NOTHING before it calls the
//     step's function, in the caller's transaction, and the function writes
//     its effect through that transaction: record and effect commit
//     together or not at all. A step retried or redelivered after its
//     commit is skipped and returns the result recorded the first time; a
//     step whose transaction rolled back, or whose process died before
//     COMMIT, left nothing and runs again if its event is redelivered while
//     the saga is still Running. A step whose function failed leaves
//     nothing either, even in a transaction that goes on: StepTx runs the
//     record and the function in a savepoint and rolls back to it. There
//     is no SELECT before the INSERT (no TOCTOU window).
//   - Concurrent duplicates run once. A second transaction recording the
//     same step waits for the first (PostgreSQL on the primary key, SQLite
//     for its single write lock) and then skips it, or runs it if the
//     first rolled back.
//   - Deterministic events. EmitTx sets an event's ID to EventID(sagaID,
//     stepName, name), derived from the step (event.StepID, event.DerivedID),
//     so a step that runs again emits the same IDs; the outbox's unique
//     event_id makes the repeat a no-op and downstream inboxes drop it
//     anyway.
//   - Compensation in reverse. Compensate runs the compensation of every
//     completed forward step, most recent first, each as the step
//     CompensationName(step) ("compensate:" + step) in a transaction of its
//     own, so each runs once however often Compensate is called or retried.
//     A step that never completed is never compensated. Once a saga is
//     compensating, forward steps are refused (a *StateError); on
//     PostgreSQL a forward step whose transaction is still open when
//     compensation starts makes Compensate wait for it and is then
//     compensated too.
//   - State survives crashes. The saga's state (running, completed,
//     compensating, compensated, failed), its input and its completed steps
//     with their results live in the tables saga and saga_step; Get and
//     Resume read them, the Coordinator keeps nothing in memory. A
//     compensation that keeps failing leaves the saga Failed with the
//     compensations done so far recorded; the next Compensate (or Resume)
//     continues from there. A failure of the database (a connection lost,
//     a serialization failure, a read-only or full database, a privilege
//     refused, missing tables) is not the compensation's: Compensate
//     returns it at once and the saga stays Compensating. A statement of
//     the compensation cancelled by statement_timeout or lock_timeout is a
//     failed attempt: one that always times out leaves the saga Failed,
//     not Compensating for ever.
//
// # Driving a saga by events
//
// A saga advances when it consumes an event, never from memory. The
// consumer of each event runs, in one transaction: inbox.ProcessTx (the
// event is applied once), StepTx (the step runs once, with its effect), and
// EmitTx for the events that trigger the next step (published by the outbox
// relay after the commit); then it commits and acknowledges the event. After
// a crash, the broker redelivers the events whose offsets were not
// committed; their steps either committed (the inbox, or StepTx, skips them)
// or left nothing (they run now). The saga continues from its last recorded
// step, on whichever replica consumes the event. Step and the inbox are
// complementary: the inbox deduplicates per event ID and consumer, Step per
// (saga, step), so a step triggered by two different events (a retry
// published with a new ID, a second consumer) still runs once.
//
// The last step calls CompleteTx in its transaction. A step whose function
// failed for good (a *StepError: it left nothing in the transaction) may
// call AbortTx in the same transaction and commit; otherwise the consumer of
// the failure event (PaymentFailed) calls AbortTx in its transaction, or a
// new one. Compensate runs after the commit; a recovery loop
// (at start-up, then periodically) calls Compensate for every saga List
// returns in state Compensating or Failed, so a compensation interrupted by
// a crash between the commit and Compensate is finished.
//
// # What the caller must do
//
//   - Write a step's effect through the transaction Step passes to its
//     function, and only through it. After StepTx returned an error other
//     than a *StepError, roll the transaction back.
//   - Make effects outside the database idempotent (a payment provider's
//     idempotency key, for example EventID(sagaID, stepName, "charge")): a
//     step or compensation whose transaction rolled back runs again.
//   - Reconcile effects outside the database with their provider. A step
//     whose transaction rolled back (a failed commit, a crash after an HTTP
//     capture) runs again only if its event is redelivered while the saga
//     is still Running; if the saga is aborted first, the step has no
//     record, its compensation never runs, and the outside effect of the
//     rolled-back attempt stays: only the provider's side (a capture without
//     an order, found by its idempotency key) can find it.
//   - Keep step names stable: a renamed step is a new step and runs again.
//     Give every step of a saga its own name: a second, different step
//     under a name already recorded (one name for every item of a loop) is
//     taken for a redelivery of the first and skipped, returning the
//     first one's result with ran false and no error.
//   - Keep finished sagas at least as long as their events can be
//     redelivered. The cleaner of package cleanup deletes a saga that
//     finished (Completed or Compensated), with its steps,
//     cleanup.Config.Sagas.TTL after it finished (72h by default, the
//     default inbox retention; it warns when the inbox keeps events longer).
//     Running, compensating and failed sagas are never deleted.
package saga
