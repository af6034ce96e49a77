// Command idemd is idem's reference daemon: a small payments and orders
// service. POST /v1/payments is exactly-once, protected by an
// Idempotency-Key (the idemhttp middleware) and by a UNIQUE
// (payment_provider, external_payment_id) constraint (package uniq).
// POST /v1/orders stores an order and its OrderCreated.v1 event in one
// transaction (transactional outbox); a relay publishes the event to Kafka
// and a consumer applies it once (inbox) to a per-customer projection read
// by GET /v1/customers/{id}/summary:
//
//	HTTP -> order + outbox (one tx) -> relay -> Kafka -> inbox consumer -> projection
//
// A second consumer drives an order payment saga (package saga) from the
// same events: OrderCreated.v1 charges the order once (a payment of
// provider idemd-saga, external id order-<id>) and emits
// PaymentCaptured.v1, whose consumption marks the order CONFIRMED; an
// amount over 10000.0000 is declined, the saga aborted and compensated,
// and the order REJECTED. GET /v1/orders/{id} shows the status (and the
// payment_id) as it progresses:
//
//	curl -s localhost:8080/v1/orders -H 'Idempotency-Key: o-1' -H 'Content-Type: application/json' \
//	     -d '{"customer_id":42,"amount":"19.90","items":[{"sku":"A-1","quantity":2}]}'   # "status":"CREATED"
//	curl -s localhost:8080/v1/orders/1     # moments later: "status":"CONFIRMED","payment_id":"..."
//
// It runs with one command on embedded defaults, a SQLite file and an
// in-process Kafka broker:
//
//	go run ./cmd/idemd                                  # SQLite ./idemd.db, embedded Kafka, 127.0.0.1:8080
//	go run ./cmd/idemd -db postgres://postgres@127.0.0.1:5432/test -kafka kafka-1:9092,kafka-2:9092
//	IDEMD_ADDR=:9090 IDEMD_DB=sqlite:/tmp/pay.db IDEMD_KAFKA=off go run ./cmd/idemd
//
// Flags (each overrides its environment variable): -addr (IDEMD_ADDR,
// default 127.0.0.1:8080), -admin-addr (IDEMD_ADMIN_ADDR, default none: a
// second listen address serving /metrics, /healthz and /livez for
// Prometheus and the probes, on a port the public ingress never routes;
// -addr then no longer serves /metrics, and keeps the probes), -db (IDEMD_DB: postgres://..., sqlite:PATH or a
// file path; default ./idemd.db), -db-password-file (IDEMD_DB_PASSWORD_FILE:
// a file holding the PostgreSQL password, read again for every new
// connection, so that a rotated password is used without a restart; -db and
// -db-listen then carry none), -shutdown-timeout (IDEMD_SHUTDOWN_TIMEOUT,
// default 15s), -request-timeout (IDEMD_REQUEST_TIMEOUT, default 10s, at
// most 30s: a /v1 request still waiting for the database then, for a
// connection of an exhausted pool or a lock, answers 503 with
// Retry-After), -log-format (IDEMD_LOG_FORMAT, json or text), -cleanup
// (IDEMD_CLEANUP: the cron schedule of the retention sweep, default
// "0 3 * * *", in the process's time zone unless prefixed with
// CRON_TZ=Zone, or off), -kafka (IDEMD_KAFKA: embedded, the default, an
// in-process broker, one per database, on -kafka-embedded-addr (default a
// random port of 127.0.0.1; -addr's or -admin-addr's port on the same
// host is refused)
// whose log is kept in -kafka-dir (default
// PATH.kafka next to a SQLite database, ./idemd.kafka with PostgreSQL);
// off, no relay, no consumer and no
// saga, the events stay in the outbox, orders stay CREATED and the summary
// answers 503; or the seed
// brokers host:port,host:port of a real cluster, with TLS and SASL as it
// requires: see below), -kafka-topic
// (IDEMD_KAFKA_TOPIC, default idemd.orders; dead letters go to
// TOPIC.dlq; on a real cluster both must exist: idemd never creates
// topics, and a cluster without them stops it at start-up, exit 2, naming
// the missing ones), -kafka-headers (IDEMD_KAFKA_HEADERS: idem, the default,
// cloudevents or both: the headers the events are published with;
// consumers read all three) and -kafka-source (IDEMD_KAFKA_SOURCE, the
// CloudEvents ce_source, default /idemd; refused with -kafka-headers
// idem, which writes none), -saga-stuck-after (default 1m:
// an order still CREATED gets its events published again; under 24h, how
// long the retention sweep keeps a published event, unless -cleanup off),
// -saga-give-up-after (default 15m: the saga is aborted if nothing was
// charged, else an operator is alerted) and -otel (IDEMD_OTEL, off by
// default, on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set: traces and the
// Prometheus metrics exported over OTLP/HTTP; a missing collector never
// stops idemd from starting). With -kafka off, -kafka-topic,
// -kafka-headers, -kafka-source, -saga-stuck-after, -saga-give-up-after,
// -kafka-instance-id and -kafka-session-timeout (flag or variable) stop
// idemd (exit 2): they would have no effect, since the outbox stores no
// topic or headers (a later start with Kafka publishes with its own) and
// no saga or consumer runs. An IDEMD_ variable idemd does not read (in
// any case, even empty: IDEMD_DATABSE_URL) stops idemd and each of its
// subcommands before they do anything (exit 2), naming it and the
// variable it probably stands for ("did you mean IDEMD_DB?"); -h still
// answers.
//
// A secured cluster (Confluent Cloud, MSK, Aiven, Strimzi): -kafka-tls
// (IDEMD_KAFKA_TLS) turns TLS on (1.2 or later) with the system's CA
// certificates; -kafka-tls-ca (IDEMD_KAFKA_TLS_CA), a PEM file of CA
// certificates, trusts those instead; -kafka-tls-cert and -kafka-tls-key
// (IDEMD_KAFKA_TLS_CERT, IDEMD_KAFKA_TLS_KEY, both or neither) present a
// client certificate (mutual TLS); -kafka-tls-server-name
// (IDEMD_KAFKA_TLS_SERVER_NAME) is the name the brokers' certificates must
// carry (default each broker's host); each of these implies TLS.
// -kafka-sasl (IDEMD_KAFKA_SASL: plain, scram-sha-256 or scram-sha-512)
// authenticates as -kafka-sasl-user (IDEMD_KAFKA_SASL_USER) with the
// password of the environment variable IDEMD_KAFKA_SASL_PASSWORD or of the
// file -kafka-sasl-password-file (IDEMD_KAFKA_SASL_PASSWORD_FILE); there is
// no password flag, whose value would show in ps. The files are read again
// for every new connection (the password file at every authentication),
// so a certificate renewed or a password rotated in them is used without a
// restart. Every Kafka client of
// idemd (the start-up check, the relay, both consumers) uses them; they are
// refused with -kafka embedded or off. A mechanism idemd does not speak, a
// missing user or password, an unreadable or non-PEM file, a certificate
// without its key stop idemd at start-up (exit 2); SASL PLAIN without TLS
// is logged as a warning (the password goes in clear). A cluster that
// refuses the credentials, fails the TLS handshake or lacks an ACL on the
// topic stops it too (exit 1; a refused SASL login at once, without the
// retries of an unreachable cluster), with a message that says which:
//
//	IDEMD_KAFKA=b-1.kafka.example.com:9096,b-2.kafka.example.com:9096 \
//	IDEMD_KAFKA_TLS=true IDEMD_KAFKA_SASL=scram-sha-512 \
//	IDEMD_KAFKA_SASL_USER=idemd IDEMD_KAFKA_SASL_PASSWORD="$(cat /run/secrets/kafka)" \
//	IDEMD_DB=postgres://idemd@db/pay bin/idemd
//
// "idemd demo" drives a running idemd (found at -url, its Kafka through
// GET /v1/kafka, or -kafka) like misbehaving
// clients and brokers (lost responses, concurrent duplicates, payments
// re-sent under new keys, every Kafka record produced again) and prints
// what it sent, what ran and what idemd holds; it exits 0 when there is no
// double effect, nothing is lost and every amount idemd holds, charged and
// projected is the one sent (their sums agree). It takes idemd's TLS and SASL flags
// and environment variables for its Kafka client.
//
// "idemd outbox redrive -since 2h" (or -all; either with -key K1,K2 to
// limit it to those orders) publishes again
// the events the outbox says were published, for a broker that lost them.
//
// "idemd outbox unpark -event ID1,ID2" (or -key K1,K2, or -all) makes
// parked events eligible for publishing again once the cause of their park
// is fixed: the relays publish each, then the later events of its key.
//
// "idemd migrate up|status|sql" (with -db as for idemd) manages the schema
// for deployments that migrate before starting: up applies idem's
// migrations and idemd's tables (as start-up does) and prints what it
// applied; status prints each of idem's migrations, applied or pending,
// and idemd's own pending ones (payment_migration, order_migration), each
// with whether older binaries may run against it ("older binaries:
// accept", "refuse"), and exits 0 when up to date, 1 otherwise (a version
// newer than the binary's too, unless all such versions accept it); sql
// prints the SQL of idem's
// migrations for the database's kind (PostgreSQL or SQLite), each preceded
// by a "-- NNN_name" comment and followed by the INSERT that records its
// version in idem_migration, for a DBA or a migration tool.
//
// Several replicas: run them all on one PostgreSQL with -kafka pointing at
// a real cluster (the topic and TOPIC.dlq created beforehand: idemd does
// not start without them, even on a cluster that creates topics on
// demand, since it asks for none to be created). Relays
// share the outbox safely and the consumers share the topic's partitions
// through the groups idemd-order-projection and idemd-order-saga (an
// order's events share a partition, keyed by the order ID); a dead
// replica's partitions move to the others within about 7 s. Replicas with
// stable names can be static members of the groups (-kafka-instance-id, one
// ID per replica, with a -kafka-session-timeout that outlasts a restart): a
// restarted one takes its partitions back at once. A second idemd
// with the embedded broker on one database refuses to start.
//
// The retention sweep (package cleanup) deletes expired idempotency records,
// old inbox and outbox rows and finished sagas in small batches; with
// several idemd replicas on one PostgreSQL exactly one sweeps a given run.
// Its counts are exported as idemd_cleanup_sweeps_total and
// idemd_cleanup_deleted_rows_total; the relay's lag as
// idemd_outbox_lag_seconds, its parked events as idemd_outbox_parked_total
// (and those parked now, every 10s, as idemd_outbox_parked_events),
// each consumer's work as idemd_inbox_events_total{consumer, result} and
// each consumer group's lag (every 10s) as idemd_kafka_consumer_lag{group},
// and how long a consumer's partition has been stalled behind a record
// failing on a database fault as
// idemd_kafka_consumer_stalled_seconds{consumer}, and the times a
// consumer's partition resumed past records deleted or lost before it
// applied them as idemd_kafka_consumer_offset_resets_total{consumer}.
// idemd's own metrics start with idemd_; the Go runtime's and the
// process's (go_*, process_*) are exported too.
//
// idemd prints one line on stdout with its address (and -admin-addr's), its
// database (password redacted) and its Kafka, and logs to stderr, one access log line per
// request (its method, path, route, status, duration and Idempotency-Key,
// never its body). SIGINT or SIGTERM stops accepting connections (on both listeners), waits for the
// requests in flight (two thirds of -shutdown-timeout at most: a request
// still running is then cut off, and idemd exits 1), stops the relay and
// the consumers together (they commit their batch in flight), publishes
// what is left in the outbox, closes the embedded broker and the
// database, and exits 0, all within -shutdown-timeout; a
// second signal kills it at once. A signal during start-up (connecting to
// or migrating the database, reaching Kafka) stops it at once, exit 0.
// Exit code 2 means bad configuration, 1 a
// runtime failure (such as a database still unreachable after 30 s of
// retries, or a SQLite file, or its directory, that idemd may not write).
//
// The API is for services, not for browsers: it authenticates with a
// bearer token (a request without Authorization is the one anonymous
// principal, whose keys all callers share) and answers no CORS preflight
// (OPTIONS /v1/payments is 405, without Access-Control-Allow-Origin). A
// browser app calls it through its own backend, or through a gateway
// that answers the preflights and sets the CORS headers on every answer,
// idemd's own errors included: allowing the Idempotency-Key, Content-Type
// and Authorization request headers and exposing Idempotent-Replayed,
// Retry-After and Location (README, "Browser clients (CORS)").
//
// The endpoints and the wiring are in internal/app; the domains in
// internal/payments and internal/orders.
package main
