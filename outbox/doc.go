// Package outbox is the producer side of idem: the transactional outbox.
//
// # EnqueueTx in the business transaction
//
// An event is not sent to Kafka by the code that performs the business
// operation. It is written with [EnqueueTx] into the outbox table, in the
// caller's transaction, next to the business write: both commit or neither
// does. EnqueueTx never begins or commits a transaction.
//
//	tx, _ := drv.Begin(ctx)
//	// ... business writes in tx ...
//	e, _ := event.New("OrderCreated.v1", orderID, order)
//	if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil { ... }
//	err := drv.Commit(ctx, tx)
//
// The envelope's ID is generated once per business operation (event.New) and
// stored with the event; the outbox table has a UNIQUE constraint on it, so a
// retried enqueue of the same envelope (a handler re-run after a redelivery,
// with IDs from event.DerivedID or event.StepID) stores nothing new
// (R-DIST-IDEM-X2).
//
// # What EnqueueTx refuses, and what it does not check
//
// EnqueueTx returns an error, and stores nothing of the call, for a nil tx
// and for an envelope that fails event.Envelope.ValidateStorable (the
// error names the event's position in the call and wraps the event
// package's sentinel: ErrInvalidID, ErrInvalidType, ErrEmptyKey,
// ErrInvalidKey, ErrInvalidText, ...). A transaction already committed or
// rolled back gives an error wrapping driver.ErrTxDone; on PostgreSQL, one
// that an earlier failed statement aborted, driver.ErrTxAborted. Any other
// error is the database's, wrapped. After an error, roll the transaction back
// rather than commit it: the events are not in it (a context that ended
// before the INSERT was sent leaves a transaction that would commit the
// business write alone), on PostgreSQL the failed INSERT has aborted it,
// and on SQLite a call of more than 500 events may have stored some.
//
// EnqueueTx returns nil for an envelope whose ID the outbox already holds
// (pending, parked, or published and not yet deleted by the retention
// sweep), and stores nothing for it, whatever its type, key or payload: the first
// stored version of an ID is the only one published, and the caller is not
// told. An ID belongs to one business operation; two operations given one
// ID (a DerivedID with the same parent and name for two events) lose the
// second event.
//
// EnqueueTx does not bound the payload's size. An event the broker can
// never take (larger than its max.message.bytes) is parked by the relay
// as poison when the publisher says so (idemkafka.Publisher does), and
// holds up the later events of its key until an operator unparks it: see
// "Failures, backoff and poison events". So is an event with a header
// name that the publisher's record format reserves, and unparking it does
// not help while the format stays: with CloudEvents headers
// (event.HeaderFormatCloudEvents or HeaderFormatBoth), idemkafka refuses
// extra headers named "ce_..." in any case, which EnqueueTx, not knowing
// the format, accepts. Nor can EnqueueTx tell that tx belongs to another
// database than drv's: the events are stored where tx writes, and a relay
// of drv's database never sees them.
//
// # The relay
//
// A [Relay] claims batches of committed, unpublished events, hands them to a
// [Publisher] (the Kafka publisher lives in the Kafka package; this package
// has no Kafka dependency) and marks them published.
//
// Order: the events of one key (Envelope.Key, the aggregate ID) are published
// in the order they were enqueued (the outbox row ID). A key whose oldest
// unpublished event failed waits for that event's retry; its later events are
// never published before it. Other keys are not held up. Events of one
// aggregate are ordered by the ID the database gave their rows, so enqueue
// them after the business write that locks the aggregate (the usual
// UPDATE of its row): concurrent transactions on one aggregate then enqueue
// in commit order.
//
// EnqueueTx itself takes no lock on the key. On PostgreSQL a row gets its ID
// at INSERT, not at COMMIT, so two transactions that enqueue for one key
// without serialising on it may commit in the opposite order of their IDs:
// the higher ID, committed first, can then be published before the lower
// one is visible, and the lower one is published when it commits (events
// are never lost, skipped or stuck; a key then follows commit order, not ID
// order, which is only observable for transactions that did not see each
// other's writes). The relay reads a key's rows in ID order and cannot know
// that a lower ID is still to come; publishing in commit order would need
// the database's commit sequence (logical replication), which idem does not
// read. Serialising the transactions of an aggregate, as above, rules this
// out. SQLite serialises writers, so there IDs always follow commit order.
//
// # Lanes, replicas and concurrency
//
// On PostgreSQL every outbox row belongs to one of 64 lanes, a fixed hash
// of its key, so all the events of a key share a lane. A batch is claimed
// in a transaction that locks a few lanes that have pending events (a
// transaction-scoped advisory lock; lanes another transaction holds are
// skipped) and reads their events in ID order with a plain index range
// scan; the transaction stays open while the batch is published and
// marked. Two claims therefore never hold the same lane: no event is
// published by two relays at the same time, and a key's events are never
// interleaved. The cost of a claim depends neither on the number of keys
// pending nor on the length of one key's backlog: one busy aggregate is
// relayed as fast as a thousand quiet ones. The exception is a key whose
// head event is backing off or parked while its later events pile up:
// each claim of its lane steps over that backlog (measured once by hand,
// not by bench/: 5 ms per claim at no backlog, 24 ms at 20,000 waiting
// events, 62 ms at 200,000), so
// deal with a parked event soon (RelayConfig.OnPark, CountParked, Unpark). Run keeps
// RelayConfig.Concurrency batches (default 2) in flight at once, each on
// its own lanes, so that publishing one batch overlaps reading and marking
// the others; several relays (one per replica) share the lanes the same
// way. A batch holds at most RelayConfig.BatchSize events (500) and
// RelayConfig.BatchBytes of payloads (16 MiB; an event larger than that
// goes alone), so the memory of a relay draining a backlog of large
// events grows with Concurrency x BatchBytes, not with BatchSize x the
// event size (500 MiB per batch of 1 MiB events). A relay that stalls while holding lanes (a broker client that
// ignores its context, the network to the database lost) does not hold
// them for good: the claim sets the transaction's
// idle_in_transaction_session_timeout to RelayConfig.PublishTimeout + 20s,
// after which the server ends the session and frees its lanes, and other
// relays publish its events again (same IDs, same order). On the relay's
// side, a round's Begin and claim get 15s (and its marks 15s, a lag query
// 5s): a connection cut off without a reset (a failover that took the
// primary's host, a NAT or firewall that lost the connection) fails the
// round, which is logged and retried on another connection, instead of
// holding the relay until TCP gives up. With pgxpool the dead connection
// keeps its slot for up to 15s more (pgx drains a connection it closes
// until the server's close arrives, which a cut-off connection never
// brings, before the pool may replace it), so a relay whose pool has one
// connection publishes again up to about 35s after the cut; give it two
// or more (pgxpool's default is at least 4).
//
// Clocks: on PostgreSQL no relay decision needs the relays' clocks to
// agree (the lanes are locks, the hold timeout is the server's). Each
// relay stamps a failed event's retry time (now + Backoff) and its
// publications with its own RelayConfig.Now, and compares retry times
// with it: a relay whose clock is ahead of another's retries that one's
// failed events early, one behind, late, by the difference; order and
// delivery are not affected. The lag (OnLag) is the relay's clock minus
// the time EnqueueTx read on the enqueuing process's clock: an enqueuer
// whose clock is behind the relay's adds the difference to the lag (an
// alert on lag then fires early), one ahead hides as much of it.
//
// SQLite has no concurrent writers: there the batch is the lowest pending
// IDs, read outside a transaction and marked in a short one, so the relay
// does not hold SQLite's single write lock while it publishes, and one
// batch is in flight at a time. Two relays reading that way would publish
// the same events, so on SQLite only one relay of a database publishes at a
// time, whatever the number of processes or Relay values: Run first takes
// the lease RelayLockName (table idem_lock, under the driver's table
// prefix) and publishes only while it holds it. The other relays stand by
// (an INFO line says so) and try to take it every PollInterval (at most
// Lease/3), reporting the lag to RelayConfig.OnLag as they do. A relay
// that cannot reach the lease logs it at ERROR ("relay lease unavailable;
// not publishing", then every 100th failed attempt) and at INFO when it
// reaches it again ("relay lease available again" or "reachable again",
// with consecutive_failures). The active relay renews it every
// RelayConfig.Lease/3 (default DefaultRelayLease, 15s; a failed renewal is
// retried after 100ms, doubling up to Lease/3) and releases it when
// Run returns, after its
// round in flight has been marked, so a standby takes over within a poll;
// a relay that died without releasing it (a killed process) is taken over
// when the lease expires, within Lease. A relay whose renewals fail stops
// publishing Lease/4 before the lease's expiry (one that finds its lease
// taken over, at once): the context of its Publish ends, its marks are
// bounded by the expiry, and it stands by again. Lease times are read on
// the wall clock (not RelayConfig.Now); the relays of one SQLite file
// share a host, so a step of the clock forward by less than Lease/4 is
// harmless. A publisher that outlives
// its context, or marks that cannot commit before the expiry, may still
// leave a batch to be published again by the next relay (same IDs, in
// order), as a crash does. RunOnce takes the lease for its round too (and
// releases it, unless its relay's Run or another of its RunOnce calls still
// holds it), and returns ErrStandby,
// publishing nothing, while another relay holds it. A driver that is not a
// driver.LockStore (a wrapper that hides sqlitedriver's Locks) gets no
// lease: Run logs a warning, and running two relays there publishes the
// same events concurrently.
//
// RelayConfig.OnLease tells whether Run publishes, for a gauge: it is
// called once when Run starts, with the initial state, then only on
// changes, never per batch. On SQLite it is true while the relay holds
// the lease and false while it stands by (another relay holds it, or it
// cannot be reached), so false again when the lease is lost, and false
// when Run returns after holding it. On PostgreSQL relays share the lanes
// and never stand by: true when Run starts, false when it returns. RunOnce
// does not call it.
//
// # Delivery guarantee: at least once, with stable IDs
//
// Publishing and marking are two systems; no transaction spans both. A relay
// that crashes (or loses its database connection) after Publish returned and
// before the marks committed leaves the rows unpublished, and the next relay
// publishes them again, with the same event IDs, because the stored envelope
// is published as it is. The consumer's inbox (package inbox) drops the
// repeat. The relay never publishes a new ID for an event it has already
// tried to publish.
//
// # Failures, backoff and poison events
//
// A [Publisher] reports which events of a batch it published (see
// [PublishError]). The relay marks exactly those. For every key, the first
// event that was not published becomes the key's head: if its attempt failed
// it is retried after RelayConfig.Backoff(attempts), and the key's later
// events wait for it; an event the publisher skipped (it gave up earlier in
// the batch) is simply claimed again at the next round. Keys without a
// failure are not held up. When rounds keep failing (the broker is down) Run
// also backs off as a whole, instead of trying one event after another in a
// tight loop; a round that published some events is not a failed round, so
// a key that keeps failing does not slow the relay down for the others. A
// round whose every event the publisher skipped (holding the whole batch
// back: a circuit breaker, a rate limit) is a failed round too, though no
// attempt is counted: Run backs off, RunOnce returns an error wrapping
// ErrSkipped, and a WARN line says so ("the publisher skipped every event
// of the round"), its repeats limited as a publish failure's below. Rounds
// that failed in the database and rounds the publisher failed or skipped
// are counted apart: the first publish failure after a database outage
// waits Backoff(1), not the Backoff of the outage's count.
//
// A broker outage fails every round, and each failed event backs off by
// its own attempts: after a minute's outage, Backoff's longest wait. So
// that the broker's return is noticed within seconds, Run waits at most
// PublishBackoffCeiling (5s) after a round the publisher failed or skipped
// as a whole (or ten times that round's claim, when claims take seconds: a
// backlog of millions whose keys all back off), and the first round that publishes after such a round, in
// any worker of the relay, makes every event backing off due at once
// (attempts and last error kept): the events of the outage follow within a
// round or two, in order per key, instead of waiting out their backoff.
// An event that failed only because it is poison is retried once more that
// way, and backs off again. A relay with nothing else to publish (no new
// event since the outage) notices the return at the earliest retry of the
// outage's events, at most Backoff's longest wait; RunOnce does neither.
//
// A round's events come from every partition of the topic (a lane holds
// many keys), so a publisher that waited for every event of the round
// would let one partition that does not answer stop them all for as long
// as it does not. idemkafka.Publisher does not: it reports the events of
// such a partition failed (outcome unknown) a short StragglerTimeout after
// the others were acknowledged, and their keys back off while the others
// flow. A custom Publisher should do the same: report what is published,
// fail the rest, and never let a later event of a failed key through.
// When the outcome of such an event comes later (the broker wrote the
// record after all, or failed it), a publisher that implements
// [LatePublisher] (idemkafka.Publisher does) tells the relay: the event is
// marked published instead of being published a second time, and its key
// goes on at once (the relay is woken) instead of after its backoff, which
// reaches a minute when the fault lasted. The relay applies such outcomes
// only after the marks of their round committed, and marks an event
// published only once the earlier events of its key in that round are; a
// round that marks an event failed or parked finds it published by a late
// outcome (this relay's or another's) and leaves it so.
//
// Such a key (a topic whose writes are denied, or that does not exist) fails
// round after round while the other keys flow, so its failure is not logged
// each round. Failures are grouped by their error text (as stored in
// last_error) with every run of digits taken as equal: the text names the
// destination and the cause, while addresses, ports and counts change from
// one attempt to the next. A failure is logged at WARN when first seen ("publish
// failed", with the error and the first failed event); its repeats are
// counted and logged at most every 30 seconds ("publish still failing",
// with suppressed, the rounds not logged since the last line, and
// failed_rounds); and when an event that failed with it is published, an
// INFO line ("published again after failed rounds", with failed_rounds and
// over, the time since the first) marks the end of the incident. A failure
// not seen for 5 minutes is forgotten, with an INFO line (its events were
// published by another relay, failed with another error, were parked or
// removed). Parked events are still logged one by one; the errors RunOnce
// returns and the callbacks (OnPublished, OnLag, OnPark) are not limited.
//
// A database outage fails every round of Run (each worker retries at least
// every StorageBackoffCeiling) and every lag query, so their lines are
// limited the same way. A round that failed in the database is logged
// when its failure is first seen ("relay round failed", with err,
// consecutive_failures and retry_in): at WARN when the failure is a
// passing one (a connection lost or refused, the server restarting, a
// failover: it usually ends within a round or two), at ERROR otherwise
// (idem's tables missing, a bug). Failures are grouped by error text as
// above and shared by the workers: a failure with another text during the
// outage (connections refused, then "the database system is starting
// up") is new and logged at once. Its repeats are counted and logged at
// ERROR at most every 30 seconds ("relay rounds still failing", with the
// latest error,
// suppressed, failed_rounds and ok_rounds, the rounds that went through
// meanwhile), and the first round that goes through the database 10
// seconds after the last failed one logs one INFO line ("relay rounds
// succeed again after failed rounds", with failed_rounds, ok_rounds and
// over, for all the texts together): rounds that alternate failing and
// going through (a database short of connections) are one failure, not
// two lines a flip. A failed lag query logs "lag unknown" at WARN once,
// whatever the error, then at most every 30 seconds ("lag still unknown",
// with suppressed, failed_queries and ok_queries), and one INFO line ("lag
// known again after failed queries") when a query succeeds 10 seconds
// after the last failed one. The wake-up
// listener (PostgreSQL LISTEN) tries to connect again every 5 seconds
// during an outage: its first error is logged at WARN ("wake-up listener
// lost its connection; polling until it reconnects"), its repeats at most
// every 30 seconds ("wake-up listener still reconnecting", with
// suppressed and failed_attempts), and its reconnection at INFO
// ("wake-up listener reconnected", with failed_attempts and over).
// Metrics, the callbacks, the backoff and the errors returned are
// unchanged.
//
// An event is parked as poison when the publisher marks its error with
// [ErrPoison] (a record that can never be published: too large, or
// invalid; a denied write, such as Kafka's TOPIC_AUTHORIZATION_FAILED, is
// not poison but configuration, retried with backoff until an operator
// grants the ACL, so that no event is parked for it), or when it has failed RelayConfig.MaxAttempts times (0, the
// default, means never). Note that MaxAttempts counts every failed attempt,
// those made during a broker outage too, so set it with the outage you want
// to ride out in mind, or leave it at 0 and let the publisher classify
// errors. A parked event stays in the table, is never retried, is logged as
// an error and reported to RelayConfig.OnPark, and blocks the later events
// of its own key (per-key order matters more than progress on that key);
// other keys go on. The lag reported to RelayConfig.OnLag keeps growing
// while a parked event waits, so an alert on lag catches it. [CountParked]
// says how many events are parked now (OnPark counts the parks, and is not
// told of an unpark): read it periodically for a gauge. After fixing
// the cause, an operator unparks the event with [Unpark] (by event ID, by
// key, or every parked event; idemd has it as "idemd outbox unpark"): its
// parked state, attempts and backoff are cleared, and the relay publishes
// it, then the later events of its key. Unpark does what these statements
// do, which remain a fallback without Go at hand. On PostgreSQL an event's
// delivery state is in its row of outbox_pending (the table of the events
// not yet published):
//
//	UPDATE outbox_pending SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
//	WHERE id = (SELECT id FROM outbox WHERE event_id = '...') AND parked_at IS NOT NULL;
//
// On SQLite it is in the outbox row itself:
//
//	UPDATE outbox SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
//	WHERE event_id = '...' AND parked_at IS NOT NULL;
//
// # Wake-ups
//
// The relay polls every RelayConfig.PollInterval. On PostgreSQL the driver's
// OutboxInsert also calls pg_notify in the enqueuing transaction, which is
// delivered on commit; pgdriver.Driver.ListenOutbox (and pgsqldriver's, over
// pgx's stdlib) turns those notifications into a channel. A relay whose
// RelayConfig.Wake is nil finds it by itself (the driver is a Notifier) and
// listens while it runs, so new events are published within milliseconds
// while polling stays the fallback; pass your own Wake to combine other
// signals, or set RelayConfig.NoListen to poll only. PostgreSQL commits
// the transactions that notified one at a time, server-wide (a notifying
// COMMIT holds a lock until its WAL flush is done, so such commits get no
// group commit): where many transactions enqueue at once, the drivers'
// Config.NoOutboxNotify enqueues without pg_notify, and a relay on such a
// driver polls (it logs so at INFO). The relay does not
// wait for its listener to start (a pooler may queue its connection): it
// polls until then. If the listener cannot start (the database
// restarting), the relay polls and starts it again in the background.
package outbox
