// Command idemd is idem's reference daemon: a small payments service whose
// POST /v1/payments is exactly-once, protected by an Idempotency-Key (the
// idemhttp middleware) and by a UNIQUE (payment_provider,
// external_payment_id) constraint (package uniq).
//
//	go run ./cmd/idemd                                  # SQLite ./idemd.db, 127.0.0.1:8080
//	go run ./cmd/idemd -db postgres://postgres@127.0.0.1:5432/test
//	IDEMD_ADDR=:9090 IDEMD_DB=sqlite:/tmp/pay.db go run ./cmd/idemd
//
// Flags (each overrides its environment variable): -addr (IDEMD_ADDR,
// default 127.0.0.1:8080), -db (IDEMD_DB: postgres://..., sqlite:PATH or a
// file path; default ./idemd.db), -shutdown-timeout (IDEMD_SHUTDOWN_TIMEOUT,
// default 15s), -log-format (IDEMD_LOG_FORMAT, json or text), -cleanup
// (IDEMD_CLEANUP: the cron schedule of the retention sweep, default
// "0 3 * * *", or off).
//
// The retention sweep (package cleanup) deletes expired idempotency records
// and old inbox and outbox rows in small batches; with several idemd
// replicas on one PostgreSQL exactly one sweeps a given run. Its counts are
// exported as idem_cleanup_sweeps_total and idem_cleanup_deleted_rows_total.
//
// idemd prints one line on stdout with its address and database (password
// redacted) and logs to stderr, one access log line per request. SIGINT or
// SIGTERM stops accepting connections, drains in-flight requests, closes the
// database and exits 0; a second signal kills it at once. Exit code 2 means
// bad configuration, 1 a runtime failure (such as an unreachable database).
//
// The endpoints and the wiring are in internal/app; the payments domain in
// internal/payments.
package main
