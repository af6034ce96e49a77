// Package idemkafka is idem's Kafka glue, on franz-go: a consumer runner that
// applies each event once through an inbox, and an outbox publisher with the
// idempotent producer enforced. It is the only idem package that imports a
// Kafka client, so a service that uses only the HTTP middleware does not
// link one.
//
// # Records
//
// An event travels as a record whose key is the aggregate key (so one
// aggregate's events share a partition and keep their order), whose value
// is the JSON payload, and whose headers carry the event ID, type, saga ID
// and occurrence time (see package event). [Record] and [Envelope] convert.
// A consumer deduplicates on the ID header without parsing the payload.
//
// # CloudEvents
//
// For consumers that are not idem (Java, Knative, any CloudEvents SDK), set
// [PublisherConfig].HeaderFormat to event.HeaderFormatCloudEvents and
// Source to a URI-reference naming the service ("/orders-service"): records
// then carry the CloudEvents Kafka binding's binary-mode headers (ce_id,
// ce_type, ce_time, ce_source, ce_subject, ...; content-type
// application/json) instead of idem's, with the same key and value.
// event.HeaderFormatBoth writes both sets, to migrate a topic while old
// idem consumers still read it. The [Consumer] needs no setting: it reads
// every format ([Envelope]) and deduplicates on ce_id as on idem-event-id;
// a CloudEvent from another producer must have a ce_id idem accepts (a
// UUIDv7, or a version-5 UUID as a saga step's fallback ID is: see
// event.StepID), a ce_type matching event.TypePattern and a ce_time, or it
// is dead-lettered.
//
// # Consumer
//
// [Consumer] runs a franz-go consumer group with auto-commit off and
// BlockRebalanceOnPoll. Each poll is handled partition by partition: the
// partition's records are applied with inbox.ProcessBatch in ONE database
// transaction (one INSERT ... ON CONFLICT DO NOTHING for all their event
// IDs, then the handler for each new event, then COMMIT), and only then are
// their offsets committed, for exactly the records whose transaction
// committed. Then the rebalance is allowed. So:
//
//   - An offset is never committed ahead of the database. A crash after the
//     database commit and before the offset commit redelivers records the
//     inbox then skips as duplicates; a crash before the database commit
//     redelivers records that were never applied.
//   - A rebalance waits for the batch in flight (it is applied and
//     committed first), so a revoked partition has nothing left to commit
//     and no member ever commits a partition it no longer owns. The client
//     keeps heartbeating while a poll is applied, so a long poll alone
//     loses nothing; but a rebalance that waits for it longer than the
//     rebalance timeout (kgo.RebalanceTimeout, 60 s by default) evicts the
//     member: it loses its partitions, its offset commit is refused and
//     the new owner's redelivery is skipped by the inbox. kgo then joins
//     again under a new member ID without calling OnPartitionsLost,
//     keeping the old membership's fetch positions and the records it had
//     fetched: the consumer commits nothing fetched under the old
//     membership, also when polled after the join (kgo would commit it
//     under the new one, moving the group's offsets back, even of
//     partitions the new membership does not own), and consumes its
//     topics anew from the group's offsets (logged at INFO). The whole poll
//     counts, all its partitions in turn: at the start of a database
//     outage each of them takes up to Retry.Attempts tries and their
//     backoffs before the partition is rewound (then one try per poll
//     while it stays stalled, below): keep the rebalance timeout above the
//     partitions of a poll × Retry.Attempts × (a failed try + its
//     backoff), or lower Retry.
//   - A handler error on record i of a batch rolls the batch back; the
//     records before i are applied again in a transaction of their own,
//     then record i alone, with backoff, up to Retry.Attempts times. A
//     record that still fails, whose handler returns an error wrapping
//     [ErrPoison], or that is not an idem event at all, is copied to the
//     dead-letter topic (synchronously, acks=all) with headers naming the
//     error and its origin, and only then is its offset committed: one
//     poison record never stalls its partition, and is never lost.
//   - A database error (not the handler's) retries the whole batch with
//     backoff, then rewinds the partition to the first record not applied
//     (kgo's SetOffsets) and, after one more backoff (with the rebalance
//     allowed), polls it again: an outage slows a partition down but never
//     skips a record. The same holds when the dead-letter
//     topic cannot be written, and when the handler returns a database's
//     passing failure (a serialization failure, a deadlock, a lock or
//     statement timeout, a session ended by the server (a restart,
//     pg_terminate_backend, idle_in_transaction_session_timeout), a lost
//     database connection, a database that refuses writes (a hot standby
//     after a failover, default_transaction_read_only), the server's
//     resources (a full disk, out of memory, temp_file_limit) or an I/O
//     error, SQLite busy, or its file read-only, full or failing, by SQLSTATE
//     or code), driver.ErrNotMigrated (its
//     outbox.EnqueueTx found idem's tables missing), or PostgreSQL refusing
//     the role a privilege (42501: a GRANT revoked) or a login (class 28: a
//     password rotated): that is the database's fault, not the record's, so
//     it is never dead-lettered (a row-level security policy refusing a
//     record is 42501 too: wrap it in [ErrPoison] to dead-letter the
//     record). Any other handler error, an HTTP client's included, is the
//     record's.
//   - So one record whose own statement always fails on such a fault (a
//     row locked by a transaction that never ends: lock_timeout, 55P03; a
//     statement over statement_timeout, 57014) stalls its partition until
//     an operator removes the cause. A partition that has applied nothing
//     for a minute is logged at ERROR ("idemkafka: partition stalled",
//     naming the topic, partition, offset, event ID and error), again
//     every minute while it lasts (its per-try warnings drop to DEBUG
//     meanwhile), and at INFO when it moves again; [Consumer.Stalled]
//     measures it for a gauge to alert on. A partition is tried once per
//     poll, not Retry.Attempts times, from the poll after the first that
//     gave up on it until it moves: the partitions of a poll are applied
//     in turn, so each try of a record waiting on a lock holds the
//     consumer's other partitions up for the lock wait. The rewound
//     partition is fetched again only after the records the client
//     already holds for the others, so those tries are few while the
//     others have work (measured: a healthy partition's 300 records,
//     polled 5 at a time, applied in 1.0-2.2s beside a partition stalled
//     on a 300ms lock wait, tried 3 or 4 times meanwhile;
//     TestStalledPartitionDoesNotHoldTheOthers).
//   - A COMMIT refused by a constraint violation (a foreign key or a
//     constraint trigger declared DEFERRABLE INITIALLY DEFERRED, checked at
//     COMMIT) is the records' fault too, though it names none: the batch's
//     records are applied one at a time, so the one at fault is refused
//     alone, retried and dead-lettered like a failing record, and the
//     others are applied.
//   - So is a COMMIT that PostgreSQL answered with ROLLBACK (pgdriver and
//     pgsqldriver report it wrapping driver.ErrTxAborted): a handler ran a
//     statement that failed, ignored its error and returned nil, which
//     aborted the transaction. Nothing was committed, and the same effects
//     fail the same way: the records are applied one at a time and the one
//     at fault is dead-lettered. A connection lost during COMMIT stays a
//     database failure (the outcome is unknown: retried, never
//     dead-lettered), and so does SQLite's transaction rolled back by
//     SQLite itself (a full disk, an I/O error).
//   - A dead-letter copy too large for the dead-letter topic (or the
//     client) is sent without its value, with HeaderDLQTruncated, pointing
//     at the original in its topic.
//   - A partition whose records at the group's offset are gone (deleted by
//     retention or DeleteRecords while the group was down or behind, or
//     lost by the broker) answers OFFSET_OUT_OF_RANGE, and kgo resumes per
//     ConsumeResetOffset, the log start by default: the records in between
//     are never applied. That is data loss: the consumer logs it at ERROR
//     (with the topic, the partition and the offset the group was at,
//     prior_offset) and counts it in [Consumer.OffsetResets], for a metric
//     to alert on; kgo alone did not say it. Keep the topics' retention
//     above the longest time a consumer may be down or behind. To stop
//     instead of skipping, give ExtraOpts
//     kgo.ConsumeResetOffset(kgo.NoResetOffset().AtStart()) (AtStart:
//     kgo's NoResetOffset alone starts a partition without a committed
//     offset, one added to a topic say, at its end, which the consumer
//     warns of): the partition then applies nothing more and commits
//     nothing past the lost records, every fetch of it fails with
//     OFFSET_OUT_OF_RANGE (logged at ERROR the first time, then at most
//     every 30 s) and its lag grows, until an operator, having recovered
//     what was lost (the producers' outboxes), moves the group's offset
//     (kafka-consumer-groups --reset-offsets --to-earliest, the group's
//     consumers stopped); a restart alone stops again.
//   - A topic deleted while consumed (and maybe created again, to change
//     its partitions or settings) answers UNKNOWN_TOPIC_ID: kgo fetches a
//     topic by the ID it first learned and never consumes a new instance
//     of it, so the consumer purges the topic from its client and
//     subscribes to it again (WARN), dropping the offsets it had left to
//     commit for it: the new topic is consumed from its start (Kafka
//     deleted the group's offsets with the old one), once it exists.
//   - Cancelling Run's context finishes the transaction in flight, commits
//     its offsets and leaves the group.
//   - Each transaction is bounded by ConsumerConfig.TxTimeout (1 minute by
//     default): one whose database connection stops answering without
//     being closed (a network partition, a failover behind a load
//     balancer or NAT) is given up then, its connection closed, and
//     retried as a database failure, instead of waiting as long as TCP
//     does (about 15 minutes, with every partition of the consumer held
//     and nothing logged). The retries wait for the event rows the lost
//     transaction recorded until PostgreSQL ends its session (keep the
//     server's TCP keepalives short, or set
//     idle_in_transaction_session_timeout): the partition is reported
//     stalled meanwhile.
//
// With ConsumerConfig.InstanceID the consumer is a static member of its
// group (KIP-345): restarted under the same ID, it takes its partitions
// back at once instead of after its old session expired, and the other
// members are not rebalanced; stopped, it does not leave the group, and its
// partitions wait for it until its session times out. A consumer fenced by
// another that joined with its ID stops: Run returns an error wrapping
// [ErrFenced], at once even while it backs off between failed polls (kgo
// would otherwise join again and fence the other). This is the classic
// group protocol's behaviour; an InstanceID with KIP-848's
// ServerSideBalancer is refused. Static or not, the inbox makes every
// redelivery harmless.
//
// # Evolving events
//
// An event's type names its schema version ("OrderCreated.v1",
// event.TypePattern). The record around it does not change with the
// version: the key, the JSON value and the idem headers are written the
// same way by every idem release (event.Envelope.RecordHeaders), an
// outbox row holds the envelope's fields and its extra headers as they
// were enqueued, so rows an older binary enqueued are published by a newer
// relay as they are and the reverse, and a consumer ignores headers with
// the "idem-" prefix it does not know (a newer release's) and hands every
// other header to the handler in Envelope.Headers (trace context, tenant,
// the CloudEvents extensions of a record that is not a CloudEvent).
//
// The rules a team follows for the payload itself:
//
//   - A change every consumer still reads keeps the type: a field added
//     (encoding/json ignores fields a struct does not have; a consumer
//     that decodes with DisallowUnknownFields must not). A change one may
//     not read is a new version, a new type: a field renamed, removed or
//     retyped, a meaning changed. A renamed field under the old type
//     decodes as a zero value; the handler should refuse that as poison,
//     not apply it.
//   - Upgrade consumers first: deploy the consumers that handle both
//     OrderCreated.v1 and OrderCreated.v2, then the producers that emit
//     v2. Drop v1 from the consumers only once no producer emits it and no
//     v1 event waits in an outbox or in the topic unconsumed.
//   - A handler says what a type it does not know means to it, by what it
//     returns. nil applies it as a no-op: the inbox records the event ID
//     and the offset is committed, so this consumer never sees it again,
//     upgraded or not (BatchStats counts it as Applied); right for types
//     that are not this consumer's business. An error wrapping [ErrPoison]
//     dead-letters it at once (WARN "idemkafka: record dead-lettered",
//     BatchStats.DeadLettered) and the partition goes on, with the event
//     not recorded in the inbox, so it can be applied later; right for a
//     version it does not know of a type it acts on (a producer upgraded
//     before it), and for a payload it cannot decode. Any other error is
//     retried Retry.Attempts times and then dead-lettered. No handler
//     result holds a partition for ever: only database faults (above) do.
//   - A record that is not an idem event at all (a missing or malformed ID,
//     type or time header, a value that is not JSON, such as a truncated
//     one, a CloudEvent in structured mode: content-type
//     application/cloudevents+json without ce_ headers) never reaches the
//     handler: it is dead-lettered at once, with [HeaderDLQAttempts] 0 and
//     the decoding error in [HeaderDLQError].
//
// A dead letter keeps the original's key, value and headers, its event ID
// included. Once its cause is fixed (the consumers upgraded), replay it by
// producing a copy to the topic in [HeaderDLQTopic] with the dead letter's
// key, value and headers as they are (the "idem-dlq-" ones may stay: the
// consumer ignores them): every inbox that recorded the event drops the
// copy, one that did not applies it, so a replay run twice, or a copy
// that reaches consumers that applied the original, is harmless. Two
// limits: an inbox forgets event IDs after its TTL (cleanup), so a replay
// reaching a consumer group that applied the original longer ago than that
// applies it again (replay within the TTL, or to a topic only the failing
// consumer reads); and the copy comes after the key's later events, which
// the handler must tolerate, as it does a redriven event
// (outbox.Redrive, the other way to send an event again while the outbox
// still holds it). A dead letter with [HeaderDLQTruncated] has no value:
// copy the original from its topic, partition and offset instead.
// TestDeadLetterReplayAfterUpgrade runs this: a producer upgraded first,
// the old consumer dead-letters the new version, a truncated record and a
// structured CloudEvent, the partition goes on, and after the upgrade the dead letters, copied
// back twice, are applied once with their original headers.
//
// # Batch handler
//
// With [ConsumerConfig].Handler the handler runs once per new event, so
// each event costs at least one statement and one round trip to the
// database, which bounds a partition's throughput. When the effect of many
// events can be written at once (a multi-row INSERT with unnest, COPY),
// set BatchHandler instead: the partition's records are applied with
// inbox.ProcessBulk, and the handler receives all the batch's new events
// (duplicates removed, offset order) in one call, in the same transaction
// as their dedup rows. The guarantees above hold unchanged; only the
// handler error differs, since it cannot name the record at fault. A
// database's passing failure (deadlock, lock timeout, lost connection)
// retries the whole batch after a backoff; any other error rolls the batch
// back and its records are applied again ONE AT A TIME, each in
// a transaction of its own with a one-event slice, so the record at fault
// fails alone and is retried and dead-lettered as with Handler, the others
// are applied, and then the partition returns to whole batches. Offsets
// are committed, as always, only for records whose transaction committed
// (or that were dead-lettered).
//
// The handler writes its effects through the transaction it receives, and
// emits follow-up events with outbox.EnqueueTx in that transaction. Effects
// outside the database are not covered by the inbox.
//
// # Publisher
//
// [Publisher] implements outbox.Publisher. Its client produces with
// franz-go's idempotent producer and acks=all; options that would turn
// either off are refused at construction ([ErrNotIdempotent]), and so is a
// partitioner that spreads a key over partitions ([ErrUnsupportedOption]). A broker
// retry of an appended batch (a replica timeout) is then deduplicated by
// the broker's sequence numbers, and records of one key stay in order. A
// client whose producer ID kgo failed for good (an InitProducerID the
// broker refused) is replaced by a new one, so publishing resumes once the
// cause is fixed.
// Idempotence does not span producer sessions or separate Publish calls: a
// relay that crashes after publishing and before marking the rows
// published publishes them again, with the same event IDs, and the
// consumer's inbox drops the copies (rule R-DIST-IDEM-X2 asks for both).
//
// One partition that does not answer (its leader hung or cut off) does not
// stop the others: a Publish waits for its records at most
// [PublisherConfig].StragglerTimeout (2s) after the broker acknowledged the
// call's other records, then reports them failed with [ErrOutcomeUnknown]
// (the client keeps them and may still write them). When the broker tells
// their outcome, [Publisher.PublishLate] (outbox.LatePublisher, which the
// relay uses) reports it: the events written after all are marked
// published instead of being published again, and their keys go on at
// once instead of after their backoff. Until the broker tells it, the
// later events of their keys fail at once without a record, so a key's
// order holds and the stuck records never fill the client's buffer, shared
// by every partition; measured with a relay on PostgreSQL at 3,000 events/s
// over 1,000 keys and one of 6 partitions unanswered for 45s, the other
// partitions were published at the speed they had before (they stopped for
// the whole fault without it). After a 45s fault, the stuck keys were
// published as soon as the records' outcomes came instead of up to a
// minute later, and none twice (hundreds before). A publisher given a
// PublisherConfig.Client waits for every record, as before.
//
// kgo retries, without telling why, a record whose partition answers a
// retriable error: NOT_ENOUGH_REPLICAS while fewer replicas than the
// topic's min.insync.replicas are in sync (acks=all cannot be met),
// NOT_LEADER_OR_FOLLOWER during a leader election. Such events fail with
// the context's deadline or ErrOutcomeUnknown and wait in the outbox until
// the cluster heals; their error (the relay's "publish failed" line, the
// events' last_error) then also names the broker's last answer to the
// topic's partitions ("the broker's last answer to the topic's records:
// partition 1 (2 s ago): NOT_ENOUGH_REPLICAS: ...", wrapping kerr's
// error), read from the client's debug lines while records wait longer
// than usual (half the straggler wait, or the end of the call's context;
// not with a PublisherConfig.Client or a negative StragglerTimeout), and
// what the cluster's metadata shows of their topic (partitions without a
// leader, replicas out of sync), asked at most every 5s per topic and only
// after such a failure. They are
// stragglers too, so the other topics' events flow meanwhile: a Publish
// whose records all wait so returns after StragglerTimeout once the broker
// acknowledged other records, not at the end of its context. Those must be
// acknowledged while it waits, or a record must have been given up within
// the last minute: a Publish of the failing topic's records alone, with
// nothing else in flight and no such fault known (the first one after the
// topic began to refuse, typically), cannot tell a topic that refuses from
// a slow cluster and waits for its context once (the relay's
// PublishTimeout, 30 s), holding its round; the rounds after it give up
// within StragglerTimeout for as long as the fault lasts. The client
// keeps the records a Publish gave up waiting for, whatever its context
// says, until the broker writes them or fails them (those buffered behind
// the ones a stuck leader holds are sent after the heal): ended with the
// context, kgo failed the other records buffered in their partition, other
// calls' included, and a later record of their keys could overtake them.
// PublishLate reports each outcome: the relay marks the written events
// published, and retries the failed ones at once.
//
// # Topics
//
// Neither the publisher nor the consumer creates a topic, and neither
// fails at start when one is missing: a publish to a missing topic fails
// at once, without a record (UNKNOWN_TOPIC_OR_PARTITION, with the topic's
// name and the fix: the publisher asks the cluster's metadata about a topic
// at its first publish, and about a missing one at most every 5 s), and
// the event waits in the outbox while the other topics' events flow; a
// consumer of a missing topic WARNs once and
// waits for it, and a record to dead-letter holds its partition until the
// dead-letter topic (the topic followed by [DeadLetterSuffix], ".dlq")
// exists. So a topic never created, or a typo in its name, on a cluster
// that does not create topics on demand shows up only as a backlog.
// [CheckTopics] asks the brokers, with one metadata request that creates
// nothing, whether they have the topics ([ConsumerConfig.RequiredTopics]
// lists a consumer's, dead-letter topics included), and returns a
// [*TopicsError] naming those missing (it wraps [ErrTopicMissing]) and
// those the client may not describe (TOPIC_AUTHORIZATION_FAILED, an ACL,
// not reported as missing), with the fix: call it at start-up and refuse
// to start on it. A broker that cannot be reached gives another error,
// which says so: a service may start anyway and let the clients retry.
//
// Partitions added to a topic (kafka-topics --alter --partitions, kadm's
// CreatePartitions) are used by publishers, and handed out to consumers by
// a rebalance, within [DefaultMetadataMaxAge] (10 s, kgo.MetadataMaxAge),
// and consumed from their start (kgo's default ConsumeResetOffset): no
// record is skipped. But Kafka hashes a key over the partition count, so
// most keys' later events go to another partition than their earlier
// ones, and a consumer may apply them before the earlier events still
// waiting in the old partition (its lag then); within those 10 s the
// relays of several replicas, each learning the new count at its own
// time, may alternate a key between its two partitions. The inbox still
// applies each event once; only the order of a key across the change is
// lost. Where it matters, stop the events' flow first (docs/operations.md,
// "Adding partitions to a topic").
//
// # Tests
//
// The package's tests run against franz-go's kfake broker over real TCP
// listeners (internal/kafkatest), or against the real cluster named by
// IDEM_TEST_KAFKA_SEEDS, with PostgreSQL and SQLite for the inbox.
package idemkafka
