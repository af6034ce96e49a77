// Command cleanupbench measures what the cleanup job costs the application
// it cleans up after, on a real PostgreSQL, side by side in one run.
//
//	go run ./bench/cleanupbench               # 1,000,000 rows; about 4 minutes
//	go run ./bench/cleanupbench -rows 100000 -slice 1s
//	go run ./bench/cleanupbench -rows 200000 -hold-snapshot -partition=false
//
// It creates a private schema (dropped at exit) and:
//
//  1. seeds -rows expired processed_event rows (processed 5 days ago) with
//     one server-side INSERT ... SELECT, then VACUUM ANALYZE;
//  2. drives an insert load throughout: -writers goroutines, each inserting
//     -ids fresh UUIDv7 event ids per transaction (InboxInsert + COMMIT, as
//     a consumer does);
//  3. alternates slices of -slice without cleanup and with the cleaner's
//     RunOnce deleting the expired rows in batches of -batch with -pause
//     between (the defaults of package cleanup), until the sweep is done.
//     A RunOnce cut off at the end of its slice is simply run again in the
//     next one (the deletes are idempotent). Interleaving makes the drift
//     of a shared machine (other jobs, table growth) fall on both kinds of
//     slices alike;
//     With -hold-snapshot, a REPEATABLE READ transaction on another
//     connection takes its snapshot before the sweep and holds it until
//     the sweep is done (a long report, a replica with
//     hot_standby_feedback): the index entries of the deleted rows cannot
//     be removed meanwhile. The sweep then runs to its end in one slice,
//     since a new sweep starts again from the oldest entries;
//  4. partition mode: converts processed_event with
//     EnableInboxPartitioning, COPYs -rows rows into one day's partition
//     and times DropInboxPartitionsBefore dropping that day while the
//     insert load runs.
//
// It prints rows/s removed (over the time spent sweeping, pauses
// included), the insert throughput with the cleaner sweeping divided by the
// throughput without (target >= 0.8), insert latencies, the entries of
// the processed_at index the sweep read (idx_tup_read; about one per row
// removed, since each batch resumes after the last row of the one before),
// and the time to drop one day. Absolute numbers depend on the machine; the ratio is the result.
package main
