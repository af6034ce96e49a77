// Command cleanupbench measures what the cleanup job costs the application
// it cleans up after, on a real PostgreSQL, side by side in one run.
//
//	go run ./bench/cleanupbench               # 1,000,000 rows; a few minutes
//	go run ./bench/cleanupbench -rows 100000 -duration 5s
//
// It creates a private schema (dropped at exit) and:
//
//  1. seeds -rows expired processed_event rows (processed 5 days ago) with
//     one server-side INSERT ... SELECT, then VACUUM ANALYZE;
//  2. drives an insert load: -writers goroutines, each inserting -ids fresh
//     UUIDv7 event ids per transaction (InboxInsert + COMMIT, as a consumer
//     does), for -duration WITHOUT cleanup;
//  3. the same load WITH the cleaner's RunOnce deleting the expired rows in
//     batches of -batch with -pause between (the defaults of package
//     cleanup), for as long as the sweep takes;
//  4. the load for -duration WITHOUT cleanup again, so drift during the
//     run (table growth, other jobs) shows up;
//  5. partition mode: converts processed_event with
//     EnableInboxPartitioning, COPYs -rows rows into one day's partition
//     and times DropInboxPartitionsBefore dropping that day while the
//     insert load runs.
//
// It prints rows/s removed, the insert throughput during the sweep divided
// by the mean of the two phases without (target >= 0.8), insert latencies,
// and the time to drop one day. Absolute numbers depend on the machine; the
// ratio is the result.
package main
