// Package app is idemd, the reference daemon, minus its main: configuration
// (flags and environment), wiring of the database, idem's HTTP middleware
// and the payments endpoints, and the server's lifecycle.
//
// Run is the whole program; cmd/idemd only connects it to the process's
// arguments, environment, standard streams and signals. Exit codes: 0 after
// a clean shutdown (or -h), 1 when the database is unreachable or the server
// fails, 2 for bad configuration (flags, environment), each failure reported
// as one line on stderr.
//
// Routes, all answering errors as application/problem+json:
//
//	POST /v1/payments       create a payment (Idempotency-Key required)
//	GET  /v1/payments/{id}  read a payment
//	GET  /healthz           {"status":"ok"} after pinging the database, else 503
//	GET  /metrics           Prometheus metrics
//
// Principals: a request with "Authorization: Bearer <token>" belongs to the
// principal identified by the token (any non-empty token is accepted: this
// is a demonstration, not authentication); a request without Authorization
// belongs to one shared anonymous principal; any other Authorization is
// rejected with 401. Idempotency keys are scoped by principal, so two
// principals using the same key execute independently.
//
// The database is PostgreSQL for a postgres:// URL and SQLite otherwise;
// idem's tables and the payment table live in the same database, so that in
// idemhttp's ModeTx the payment, the idempotency record and the stored
// response commit in one transaction.
//
// Serve also runs the retention sweep (package cleanup) on Config.Cleanup's
// cron schedule, daily at 03:00 by default; replicas sharing a database
// take turns through cleanup's lease, so one sweeps and the others skip.
package app
