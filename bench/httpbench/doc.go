// Command httpbench measures what idem's HTTP middleware costs and what it
// buys, side by side in one run, against a real PostgreSQL (and SQLite).
//
//	go run ./bench/httpbench                  # 8 clients, 3 rounds of 5s per scenario, ~4 minutes
//	go run ./bench/httpbench -clients 16 -duration 10s -rounds 5 -dup 500
//	go run ./bench/httpbench -scenarios b,c -dup 0 -sqlite=false -cpuprofile cpu.out
//
// The profile's samples carry the label scenario=<id> (clients and server
// alike, since scenarios take turns), so one scenario's Go CPU can be read
// on its own: go tool pprof -tagfocus=scenario=b. Unlabelled samples are the
// runtime's own (GC workers, the scheduler).
//
// It creates a private schema (dropped at exit), starts an HTTP server on
// 127.0.0.1:0 in the same process and drives it over loopback with -clients
// concurrent HTTP clients in a closed loop (each sends its next request when
// the previous one is answered). Every scenario serves the same command,
// "create a payment": one INSERT into a payment table, answered 201 with a
// small JSON body.
//
//	a  bare     BEGIN; INSERT; COMMIT; 201. No idempotency: the baseline.
//	b  idem     idemhttp, ModeTx, pgdriver, a new key per request: BEGIN
//	            with the key's lock and the record read; the same INSERT
//	            in the middleware's transaction; the completed record with
//	            COMMIT. The handler's round trips, one record write.
//	c  replay   the keys b executed, any of them, with the replay cache on
//	            (a key evicted from the cache is read from PostgreSQL).
//	r  replay   the last 10,000 keys b executed (retries come soon after
//	            the first attempt), cache on.
//	e  replay   b's keys through a second middleware with the cache off
//	            (same scope): every replay is read from PostgreSQL.
//	f, g        first execution and replay on the generic ModeTx path (a
//	            driver without driver.TxClaimer: in-progress INSERT, then
//	            UPDATE), cache off: what pgdriver did before, for comparison.
//	d  naive    a naive check-then-execute interceptor: SELECT the record by
//	            key; if absent run the bare handler (its own transaction),
//	            then INSERT the record in a separate statement, errors
//	            ignored. Check-then-execute: concurrent duplicates all run.
//	n  naive    d's keys sent again: the interceptor's replay, one SELECT
//	            by key and no lock (informative: what one statement costs).
//	z  floor    the least database work of a middleware that never runs
//	            the handler for a replay, with the bare handler's round
//	            trips: the record read by key; BEGIN with the same INSERT;
//	            a completed record (idem's columns and indexes) with
//	            COMMIT. No lock, no in-progress state, no cache: not
//	            correct under concurrency, the ceiling of b/a.
//	y  floor    z without the read: one round trip less than the bare
//	            handler, but a replay would run the handler (its record's
//	            INSERT fails and the transaction rolls back).
//
// Scenarios are interleaved: within each round every scenario is driven for
// -duration in -slice slices that take turns in a random order, so that the
// machine's drift (other jobs, checkpoints, table growth) falls on all of
// them alike. The table reports, per scenario, medians over rounds; the
// ratio to a is the median of per-round ratios. Absolute numbers depend on
// the machine; the ratios are the result, and the targets are on them: a
// first execution at least 0.85 of a's throughput, a replay at least 5 with
// the cache and 2.5 without it. Throughput counts the expected answers only;
// when any request of a scenario (or of a) failed, its verdict is INVALID and
// httpbench exits 1.
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
// each of -dup distinct keys, to d, to b, to two idem instances (each with
// its own pool, on the same schema; the requests of a key alternate between
// them) and to the generic path, and counts the payment rows each key
// produced: more than one is a duplicate execution, a payment taken twice.
//
// With -sqlite (the default) a second table repeats a, b, c and e on a
// SQLite file with its own bare baseline (sa..sd).
//
// Keys are run-route-n by default: they share a prefix, so new records go
// into the same few pages of the record table's primary key. -keys uuid
// sends random UUIDv4 keys instead, as most clients do, and -keys uuid7
// time-ordered UUIDv7 keys, as idemclient does (both derived from the
// command number, so that replays repeat them); -records N first writes N
// completed records with keys of that shape created over the last 24 hours, then
// vacuums, analyzes and checkpoints: the shape of a service that holds a day
// or two of keys, where each first execution changes a random index page
// and the first change of a page after a checkpoint writes all of it to the
// WAL (the WAL B/req column).
//
//	go run ./bench/httpbench -scenarios b,c,e -dup 0 -sqlite=false -keys uuid -records 10000000
//
// With -pgbouncer, httpbench also starts a PgBouncer (the pgbouncer program,
// 1.18 or later; as root it runs it as postgres) with pool_mode =
// transaction and -conns server connections in front of -dsn's server, and
// adds a, b and e through it to the same interleaved rounds: pa, pb and pe,
// their ratios to pa, the bare handler behind the same PgBouncer. Their
// pools (their own, two instances as for the duplicates) send no statement
// prepared by name (pgx.QueryExecModeCacheDescribe: PgBouncer before 1.21
// keeps none from one transaction to the next), and the search_path (and
// -synchronous-commit), which PgBouncer does not pass on from a client's
// connection start, is set by PgBouncer's connect_query on each server
// connection. pgdriver notices the pooler at its first claim and takes the
// key's lock inside the claim's transaction: an uncached replay (pe) is
// BEGIN, the lock and the read in one round trip, then a ROLLBACK (sent on
// the raw connection, which the RT/req and stmt/req columns do not see).
// PG CPU/req counts PgBouncer's process and its server connections (it
// sets the client's application_name on the server connection it hands
// it). A line after the table gives pa/a, pb/b and pe/e: what going
// through PgBouncer costs each. The duplicates
// experiment then also runs on one and two idem instances through
// PgBouncer.
//
//	go run ./bench/httpbench -pgbouncer -dup 100 -rounds 3 -sqlite=false
package main
