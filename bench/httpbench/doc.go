// Command httpbench measures what idem's HTTP middleware costs and what it
// buys, side by side in one run, against a real PostgreSQL.
//
//	go run ./bench/httpbench                  # 8 clients, 3 rounds of 5s per scenario, ~2 minutes
//	go run ./bench/httpbench -clients 16 -duration 10s -rounds 5 -dup 500
//	go run ./bench/httpbench -proto 'all;single' -scenarios b,c,e,f,g,h -dup 0
//
// It creates a private schema (dropped at exit), starts an HTTP server on
// 127.0.0.1:0 in the same process and drives it over loopback with -clients
// concurrent HTTP clients in a closed loop (each sends its next request when
// the previous one is answered). Every scenario serves the same command,
// "create a payment": one INSERT into a payment table, answered 201 with a
// small JSON body.
//
//	a  bare    BEGIN; INSERT; COMMIT; 201. No idempotency: the baseline.
//	b  idem    idemhttp, ModeTx, a new key per request: claim, the same
//	           INSERT in the middleware's transaction, stored response, one
//	           COMMIT.
//	c  replay  idemhttp, keys b executed: the stored response is replayed,
//	           the handler does not run.
//	d  naive   the style guide's sample interceptor: SELECT the record by
//	           key; if absent run the bare handler (its own transaction),
//	           then INSERT the record in a separate statement, errors
//	           ignored. Check-then-execute: concurrent duplicates all run.
//
// -proto adds, per variant, two scenarios (e/f, then g/h, ...): first
// execution and replay through the unchanged idemhttp on a prototype of
// pgdriver that lives only in this directory (proto.go), to measure what a
// driver change would buy. The default, "all", pipelines BEGIN with the
// claim and the record UPDATE with COMMIT, reads the record in the claim's
// pipeline, and answers a replay from a read that runs before BEGIN.
//
// Scenarios are interleaved: within each round every scenario is driven for
// -duration in -slice slices that take turns in a random order, so that the
// machine's drift (other jobs, checkpoints, table growth) falls on all of
// them alike. The table reports, per scenario, medians over rounds; the
// ratio to a is the median of per-round ratios. Absolute numbers depend on
// the machine; the ratios are the result, and the targets are on them: a
// first execution at least 0.85 of a's throughput, a replay at least 2.0.
//
// Columns that explain the ratios: RT/req counts round trips to PostgreSQL
// per request (a pgx tracer: each query and each pipelined batch is one),
// stmt/req the statements, WAL B/req the WAL written (cluster-wide, so other
// activity on the server shows up there), Go CPU/req the CPU time of this
// process (server and HTTP clients), PG CPU/req that of the pool's
// PostgreSQL backends (from /proc/<pid>/schedstat: the server must run on
// this machine, else it reads 0).
//
// The duplicates experiment then sends -dupk identical requests at once for
// each of -dup distinct keys, to d, to b and to each prototype, and counts
// the payment rows each key produced: more than one is a duplicate
// execution, a payment taken twice.
package main
