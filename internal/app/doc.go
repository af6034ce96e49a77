// Package app is idemd, the reference daemon, minus its main: configuration
// (flags and environment), wiring of the database, idem's HTTP middleware,
// the payments and orders endpoints, the order pipeline (outbox relay,
// Kafka, inbox consumer, projection), and the server's lifecycle.
//
// Run is the whole program; cmd/idemd only connects it to the process's
// arguments, environment, standard streams and signals. Exit codes: 0 after
// a clean shutdown (or -h, or a signal during start-up, before serving), 1
// when the database is unreachable or the server fails, 2 for bad
// configuration (flags, environment, an IDEMD_ variable
// idemd does not read when Options.Environ is set, as cmd/idemd sets it),
// each failure reported as one line on stderr.
//
// Routes, all answering errors as application/problem+json:
//
//	POST /v1/payments                create a payment (Idempotency-Key required)
//	GET  /v1/payments/{id}           read a payment
//	POST /v1/orders                  create an order (Idempotency-Key required)
//	GET  /v1/orders/{id}             read an order: status CREATED, then CONFIRMED (with
//	                                 payment_id) or REJECTED, as the order saga advances
//	GET  /v1/customers/{id}/summary  the projection: orders, pending, confirmed, rejected,
//	                                 total_amount (confirmed orders only), last_order_id
//	                                 (404 before the first event arrives, 503 with -kafka off)
//	GET  /v1/kafka                   the Kafka in use: mode, seeds, topic
//	GET  /healthz                    {"status":"ok"} after pinging the database, else 503 (readiness)
//	GET  /livez                      {"status":"ok"} while the process serves, database or not (liveness)
//	GET  /metrics                    Prometheus metrics
//
// The POST endpoints answer, before the idempotency middleware claims the
// key (so the corrected request may reuse it): 415 when Content-Type is
// missing or not JSON, or names a charset other than UTF-8, or the body
// has a Content-Encoding, and 413 body-too-large for a body over the
// endpoint's limit (payments.MaxRequestBytes, orders.MaxRequestBytes: 64
// KiB), one problem whatever the size, since each endpoint's middleware
// has that limit as its MaxBodyBytes; and 408 body-timeout for a body
// that did not arrive within the server's 30 s read timeout. Malformed
// (400) and invalid (422) bodies are the key's stored outcome. A database
// that fails while a handler runs (its connection lost or terminated, a
// restart, a serialization failure, a database that refuses writes, a
// full disk, a busy SQLite: dberr.Transient) answers 503 store-unavailable with
// Retry-After: the transaction is rolled back and the 5xx is not stored,
// so a retry with the same key executes the command once; other failures
// answer 500. A problem's detail never holds a network or database error:
// those are logged.
//
// Principals: a request with "Authorization: Bearer <token>" belongs to the
// principal identified by the token (any non-empty token is accepted: this
// is a demonstration, not authentication); a request without Authorization
// belongs to one shared anonymous principal; any other Authorization is
// rejected with 401. Idempotency keys are scoped by principal, so two
// principals using the same key execute independently. The GET endpoints
// of payments, orders and summaries answer any principal: there is no
// ownership. /metrics, /healthz, /livez and /v1/kafka (which names the
// Kafka brokers) need no Authorization and share -addr with the API:
// behind a public ingress or load balancer, route only the /v1/payments,
// /v1/orders and /v1/customers paths, and scrape and probe the others
// from the internal network. With -admin-addr (Config.AdminAddr), a
// second listener serves /metrics, /healthz and /livez for Prometheus
// and the probes; -addr then answers /metrics 404 (never published
// through the ingress) and keeps /healthz and /livez, which load
// balancers probe on the port they send traffic to. Both listeners stop
// accepting together at SIGTERM.
//
// The database is PostgreSQL for a postgres:// URL and SQLite otherwise;
// idem's tables and the domain tables live in the same database, so that in
// idemhttp's ModeTx the payment (or the order and its outbox event), the
// idempotency record and the stored response commit in one transaction.
//
// # Orders and the projection
//
// The data flow of an order:
//
//	POST /v1/orders -> customer_order row + OrderCreated.v1 in the outbox (one transaction)
//	  -> outbox relay (outbox.Relay, idempotent producer) -> Kafka topic (-kafka-topic, idemd.orders)
//	  -> consumer group idemd-order-projection (idemkafka.Consumer, inbox "order-projection")
//	  -> customer_order_summary upserts, in the inbox's transaction
//
// Each arrow is at-least-once and the next step deduplicates: a retried POST
// is replayed by idemhttp, a republished event has the same ID, and the
// inbox applies an event ID once. The projection counts OrderCreated.v1
// (orders), OrderConfirmed.v1 (confirmed, and its amount in total_amount)
// and OrderRejected.v1 (rejected); pending is orders-confirmed-rejected,
// never below 0. Each event only adds to its customer's counters, so the
// events of an order may arrive in any order (republished from the outbox
// after a broker lost data, say): the summary converges all the same.
// Other event types are applied as no-ops; unreadable payloads go to the
// dead-letter topic (TOPIC.dlq). The consumer uses a batch handler
// (orders.ProjectionBatch): a partition batch's events are added up into
// one delta per customer, applied in ascending customer_id order, so
// replicas consuming other partitions lock the summary rows in one order
// and never deadlock. The summary is eventually consistent: it trails the order by
// the relay's latency and the consumer's. The relay is woken after each
// order this process stores, and on PostgreSQL by LISTEN/NOTIFY after any
// replica's; it also polls every second.
//
// # The order payment saga
//
// A second consumer of the same topic (group idemd-order-saga, inbox
// "order-saga", orders.PaymentSaga) drives the saga "order-<id>" of type
// order-payment (package saga) from the events it consumes, each in the
// inbox's transaction:
//
//	OrderCreated.v1    -> Start; step place-order (no effect, records the order ID);
//	                      step charge-payment: a payment (provider idemd-saga, external
//	                      id order-<id>, status CAPTURED) + payment_id on the order +
//	                      PaymentCaptured.v1 emitted with an ID derived from the step
//	                      (saga EmitTx, outbox)
//	                   -> or, for an amount over 10000.0000, Abort: the charge is
//	                      declined for good and never recorded (nothing to undo)
//	PaymentCaptured.v1 -> step confirm-order: status CONFIRMED + OrderConfirmed.v1
//	                      (ID saga.EventID("order-<id>", "confirm-order", "")); Complete
//	after an Abort     -> the compensator (after the batch's commit, at start-up and
//	                      every 5s) compensates Compensating sagas, and Failed
//	                      ones (a compensation kept failing) once a minute:
//	                      compensate:place-order sets status REJECTED + OrderRejected.v1
//	                      (ID saga.EventID("order-<id>", "compensate:place-order", ""))
//	                      in its transaction (a Failed saga with a completed charge,
//	                      which has no compensation, is left to an operator)
//	OrderConfirmed.v1, -> no-ops (for the projection)
//	OrderRejected.v1
//
// Nothing of a saga lives in memory: its state and steps are in the tables
// saga and saga_step, so any replica, or a restarted idemd, continues it.
// Every step runs once per saga (saga.Step), every event once per consumer
// (the inbox), and the payment exists once per order (the UNIQUE provider
// and external ID): events delivered again, even after the saga's inbox
// forgot them, change nothing; an OrderCreated.v1 of an order that is no
// longer CREATED starts nothing, even once the retention sweep deleted
// its finished saga. A saga's copy of an event that arrives after
// the saga moved on is a no-op. With -kafka off no saga runs and orders stay
// CREATED.
//
// Config.Kafka chooses the cluster. KafkaEmbedded (the default) starts an
// in-process broker (franz-go's kfake) on Config.KafkaEmbeddedAddr (a free
// port of 127.0.0.1 by default), with the topic (3 partitions) and its
// dead-letter topic created. Its log (records, committed offsets) persists
// in Config.EmbeddedKafkaDir (PATH.kafka next to a SQLite file,
// ./idemd.kafka with PostgreSQL) with an fsync per batch, so no stop loses
// an event; a marker file binds the directory to its database, and a
// directory without one (a new log) makes idemd republish the outbox
// (outbox.Redrive). One idemd per database runs the embedded broker (the
// lease EmbeddedLock); several replicas need PostgreSQL and a real cluster
// (-kafka host:port,...), whose topic and dead-letter topic must exist:
// the start-up check (idemkafka.CheckTopics) refuses a cluster that
// answers without them with a *ConfigError naming them (idemd never
// creates topics, nor asks a cluster to). Config.KafkaAuth gives every client of a real cluster (the
// start-up check, the relay, the consumers, idemd demo's) the same TLS and
// SASL options; the start-up check tells refused credentials, a failed TLS
// handshake and a missing topic ACL from an unreachable cluster, which it
// tries again within the start-up bound (as a database not reachable
// yet). KafkaOff runs no relay and no consumer (and no saga).
//
// Serve runs the relay, the projection's consumer, the saga's consumer
// (with its compensator) and the stuck-order watchdog (orders.Watchdog)
// next to the HTTP server and the retention sweep. On shutdown it drains
// HTTP first (a request in flight may still enqueue an event), stops the
// relay and the consumers together (they finish their batch and commit
// their offsets), then flushes the outbox once: consumers still running
// would keep enqueuing what the flush publishes. Close then closes the
// publisher, the embedded broker and the database.
//
// Serve also runs the retention sweep (package cleanup) on Config.Cleanup's
// cron schedule, daily at 03:00 by default; replicas sharing a database
// take turns through cleanup's lease, so one sweeps and the others skip.
//
// Metrics besides the HTTP ones: idemd_http_outcomes_total,
// idemd_cleanup_sweeps_total{result="done|skipped|interrupted|failed"},
// idemd_cleanup_deleted_rows_total,
// idemd_outbox_lag_seconds (age of the oldest unpublished event),
// idemd_outbox_parked_total (events parked as poison),
// idemd_outbox_parked_events (events parked now, counted every 10s),
// idemd_outbox_relay_active (1 while this replica's relay publishes),
// idemd_kafka_consumer_lag{group} and
// idemd_kafka_consumer_lag_failures_total{group} (records the consumer
// groups have not consumed, measured every 10s),
// idemd_kafka_consumer_stalled_seconds{consumer} (how long a partition of
// the consumer has applied nothing, behind a record failing on a database
// fault),
// idemd_kafka_consumer_offset_resets_total{consumer} (the times a
// partition of the consumer resumed past records deleted or lost before it
// applied them),
// idemd_inbox_events_total{consumer="order-projection|...",
// result="applied|duplicate|dead_lettered"} (both consumers: the
// projection's and the saga's, labelled with their inbox names),
// idemd_order_watchdog_orders_total{action="redriven|aborted"},
// idemd_orders_needing_operator and idemd_orders_waiting_for_events (the
// stuck-order watchdog).
package app
