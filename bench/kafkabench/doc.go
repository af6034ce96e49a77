// Command kafkabench measures idem's Kafka-side throughput on a real
// PostgreSQL with synchronous commit (issue 3), side by side in one run:
// what the batched inbox buys over one transaction per event, what dedup
// costs a batch, and how fast the outbox relay drains PostgreSQL into
// Kafka with per-key order kept.
//
//	go run ./bench/kafkabench                        # 3 rounds + relay; about 2 minutes on 2 cores
//	go run ./bench/kafkabench -rounds 5 -n 100000 -workers 4
//	go run ./bench/kafkabench -scenarios relay -relay-batch 100,500,2000 -relays 2
//	go run ./bench/kafkabench -scenarios latency     # relay latency at 1000 events/s; about 25 s
//	go run ./bench/kafkabench -scenarios restart     # relay and consumer SIGKILLed mid-load; about 20 s
//	go run ./bench/kafkabench -scenarios enqueue -enqueue-writers 8 # producers' commits with and without pg_notify
//	go run ./bench/kafkabench -h                     # every flag
//
// It creates a private schema (dropped at exit) with idem's tables
// (pgdriver's Migrate) and one business table per consumer scenario. The
// effect of an event is one ledger row (INSERT event_id, account, amount;
// no UNIQUE on event_id, so a duplicate effect can be counted). No Kafka is
// involved in the consumer scenarios: events are generated in memory
// (UUIDv7 IDs, as event.New makes them) and delivered the way a consumer
// would, so that the figures are the database side alone.
//
//	a   the common pattern, one transaction per event: BEGIN; INSERT INTO
//	    processed_event ... ON CONFLICT DO NOTHING; if a row was inserted,
//	    the effect; COMMIT. -workers-a goroutines (default 8) each with its
//	    own connection, so that group commit can share fsyncs between
//	    them: a's best case, to be fair to it.
//	b   idem's batched inbox as idemkafka.Consumer drives it: batches of
//	    -batch events (a poll; 500 is the Consumer's MaxPollRecords),
//	    inbox.ProcessBatch per batch (one dedup INSERT for all IDs, the handler per new event, one COMMIT). The
//	    handler is what a ConsumerConfig.Handler is: per event, so it
//	    writes the effect with its own INSERT in the batch's transaction.
//	c   b without dedup: BEGIN, the same INSERT per event, COMMIT.
//	b2  the effect batched too, as a ConsumerConfig.BatchHandler does:
//	    inbox.ProcessBulk per batch (the same dedup INSERT, then one
//	    function call with the batch's new events, which writes all their
//	    effects with one INSERT ... SELECT FROM unnest), one COMMIT.
//	c2  b2 without dedup: one INSERT ... unnest per batch.
//	f   the floor of b's dedup (informative, not in the default
//	    -scenarios): b with the cheapest durable dedup row there is, a
//	    bare uuid primary key in a table of its own (no consumer name, no
//	    processed_at, no index for a cleaner), the batch's sorted IDs
//	    written by one plain INSERT in the effects' transaction, no
//	    savepoint; if one was recorded before, the transaction rolls back
//	    and the batch runs again with ON CONFLICT DO NOTHING RETURNING. No
//	    inbox that writes a row per event can cost less; f/c is what any
//	    of them can reach, b/f how close idem's processed_event comes.
//
// b, c, b2 and c2 run -workers goroutines (default 4, half of a's; think
// partitions consumed at once), each taking the next batch. With a
// statement per event, b and c are bound by round trips, not CPU, so a
// second batch in flight per core hides that latency (on 2 cores, -workers
// 2 gave about half the throughput of 4). Every round runs each scenario once, in a random order, on a
// fresh pool, after a CHECKPOINT (so that full-page writes weigh on each
// alike) and a TRUNCATE of the tables at the round's start; the table
// reports medians over -rounds rounds and the ratios are medians of
// per-round ratios. Targets: b/a >= 5, b/c >= 0.85, b >= 30,000 events/s.
//
// Beside the figures it prints the batch size, synchronous_commit (and
// fsync, wal_sync_method, commit_delay), and per run the fsync rate: the
// pg_stat_wal.wal_sync delta over the run divided by its duration. The
// pool is closed and its backends waited for before the second reading,
// because a backend flushes its statistics at exit. pg_stat_wal is
// cluster-wide: other sessions on the server count too.
//
// Checks, per run: the effect table holds exactly one row per event (and
// processed_event one row per event for the inbox scenarios). Then a
// duplicate round redelivers -dup (10%) of the run's events, each batch
// also carrying a second copy of its first event: a and b/b2 must skip
// them all and add no effect; c and c2, having no dedup, add one effect
// per redelivery (shown, expected).
//
// The relay: -relay-n (100,000) events over -relay-keys (1000) keys, each
// carrying its key and its sequence number within the key, are enqueued
// with outbox.EnqueueTx (-enqueue-writers transactions of -enqueue-batch
// events; a writer owns a share of the keys, so a key's outbox order is its
// sequence order). Then -relays outbox.Relay instances with an
// idemkafka.Publisher (idempotent producer, acks=all) publish them to a
// kfake cluster started in the process (one broker, TCP on 127.0.0.1, a
// topic of -partitions partitions), and the time until OnPublished has
// counted them all is measured. The topic is then read back with a kgo
// client: every event present, duplicates counted, and per key the
// sequence numbers 1, 2, 3, ... in log order. -relay-batch lists the
// RelayConfig.BatchSize values to try (each on an emptied outbox and a new
// topic); -relay-concurrency sets RelayConfig.Concurrency and
// -relay-delete-published pgdriver.Config.OutboxDeletePublished; other
// RelayConfig fields keep their defaults. Targets: >= 30,000 events/s at
// every key count (-relay-keys 1 to 10,000) and >= 50,000 at 1,000 keys,
// with 1 or 2 relays, per-key order kept.
//
// The latency scenario (not in the default -scenarios) measures the
// relay's commit-to-publish latency at a steady load rather than its
// throughput. -latency-writers goroutines (8), each with its own
// connection, enqueue one event per transaction (outbox.EnqueueTx) over
// -relay-keys keys, shared out as above, at -latency-rate events/s in all
// (1000), pacing on a ticker; a writer that missed ticks (a slow commit)
// catches up at once, and the rate reached is printed. The first -latency-warmup (2s)
// is not counted; -latency-duration (20s) is. -relays relays with
// RelayConfig's defaults (Wake nil: each listens on pgdriver's
// LISTEN/NOTIFY by itself) publish to a kfake topic that a kgo consumer
// (FetchMaxWait 10ms) reads as it fills. Per event, the writer takes the
// time right after COMMIT returned, and the bench the time of the relay's
// OnPublished (broker ack and the marking transaction committed) and the
// time the consumer's fetch returned it: it prints p50, p90, p99 and max of
// commit -> published and commit -> consumed, with the writers' BEGIN..COMMIT
// and the relay's batches per second. Check: every event published once and
// consumed once, per key in order, and at least 95% of -latency-rate
// reached.
//
// The enqueue scenario (not in the default -scenarios) measures what the
// outbox's wake-up costs the producers: -enqueue-writers connections each
// committing transactions of one event (outbox.EnqueueTx), through a
// driver that notifies (pg_notify in the insert, the default) and one with
// pgdriver.Config.NoOutboxNotify, in turns of -enqueue-slice (3 s) for
// -rounds rounds; it prints both commit rates (medians) and their ratio.
// PostgreSQL commits the notifying transactions one at a time.
//
// The restart scenario (not in the default -scenarios) kills a relay and
// then a consumer mid-load, as a crash would (SIGKILL: no rollback, no
// offset commit, no LeaveGroup), and starts a new one at once. Each runs
// in a child process: this program re-executed with hidden -child flags
// (the role, the bench's schema, the kfake broker's TCP address, the
// topic), which reports "ready", its first batch through and, for the
// consumer, every batch's stats on its stdout. The relay: -restart-n
// (50,000) events over -relay-keys keys enqueued as in the relay scenario
// (a backlog filled before the relay starts, untimed: a crash then costs
// drain throughput, which concurrent writers at a fixed rate would hide),
// drained by a relay child with RelayConfig's defaults into a kfake topic
// that a kgo reader in the bench follows. Timed from the child's "ready"
// to the reader's seeing the last event (not to its marking, as relay
// does), once uninterrupted and once with the child SIGKILLed when the
// reader has seen half of the events and a new one started: it prints both
// throughputs and their ratio, the time from the kill to the new child's
// "ready" and to the broker's first acknowledgement of its publishing,
// and the events published twice (the relay is at-least-once across a
// crash: batches acknowledged but not yet marked when it died). Check,
// both runs: every event in the topic, none missing, per key the first
// copies in sequence order, no outbox row left pending. The consumer: an
// idemkafka.Consumer child (the inbox, a Handler writing one ledger row
// per event in the inbox's transaction) reads the uninterrupted run's
// topic, timed from "ready" until the group's committed offsets reach the
// end of every partition, once uninterrupted and once SIGKILLed when half
// of the records are committed plus a random part of one batch's time (the
// uninterrupted run's mean), a new member of the same group started at
// once. A killed member never leaves its group: the new one gets the
// partitions once the group session timeout (-restart-session, 6s, the
// least a stock Kafka broker accepts; kfake is started to accept less)
// expired, which is most of the gap printed (kill -> the new consumer's
// first batch committed). It prints the records the new consumer got again
// and skipped as duplicates (BatchStats.Duplicates); a batch's offsets
// are committed right after its transaction, so only a kill between the
// two leaves some, while the transaction a kill interrupts rolls back and
// its records are applied again. A third consumer run repeats the killed
// one as a static group member: in a group and inbox of its own, the
// killed child and its replacement both join with the InstanceID
// "kafkabench-consumer-0" (hidden flag -child-instance), so the new one
// gets the partitions back as soon as it joins, without waiting for the
// session to expire; it prints the same figures (static:, gap (static):,
// redelivered after the static restart). Check, each run: one effect row
// and one processed_event row per event, 0 missing, 0 doubled (the static
// run's on a line of its own). A failed check
// prints FAILED and the program exits with status 1; a run that stops
// making progress (10s without a new event in the topic, or the session
// timeout and 10s without an offset committed) is cut short and checked.
//
// Absolute numbers depend on the machine and on what else runs on it: the
// bench, PostgreSQL and kfake share the same CPUs.
package main
