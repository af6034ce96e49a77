// Package idemvet is a suite of static analyzers for the idempotency rules
// idem's packages are built on. Each rule is one analyzer with its own name,
// so a driver can switch it off (idemvet -idemfloatmoney=false ./...).
// Analyzers returns them all; cmd/idemvet runs them alone or under go vet,
// and package idemvet/golangci registers them as a golangci-lint plugin.
//
// The analyzers match idem's packages, franz-go, segmentio/kafka-go, pgx
// (v5; v4's Conn, Pool and Tx are database handles too), database/sql and
// github.com/google/uuid by import path and type. They
// look at one function at a time and follow values mostly through local
// assignments (idemretrykey also through struct fields the package
// assigns and sends in its functions, idemproducer and idemautocommit
// through the options its functions return, idemautocommit also through
// the kafka-go readers its fields hold and its functions return): most of what a helper
// function returns or does is not seen, so every rule has false negatives.
// They report only the shapes below, to keep false positives rare.
// Generated files (a "// Code generated ... DO NOT EDIT." line before the
// package clause) are not checked, except cmd/cgo's copies of the files of
// a package that imports "C": those are checked, and reported at the
// original file's lines.
//
// A finding judged correct on purpose is silenced by a comment
// "//idemvet:ignore rule[,rule...] reason" at the end of its line, or
// alone on the line just above it (a comment ending a line of code
// applies to that line only). The reason is mandatory: without one the
// comment silences nothing. Only the named rules are silenced. It works
// alone, under go vet and under golangci-lint, where //nolint:idemvet
// (the plugin's linter name) silences every rule of the line and
// //nolint:idemtxwrite nothing.
//
// idemproducer: a kgo.NewClient whose options include
// kgo.DisableIdempotentWrite() or kgo.RequiredAcks(kgo.LeaderAck()) /
// RequiredAcks(kgo.NoAck()), written in the call or in a slice of options
// built in the package (literal, append, variable), or returned by a
// function of the package; the acks also through variables, local or of
// the package (var acks = kgo.LeaderAck(): any value assigned to them
// counts). It does not see options from another package
// nor a function's parameters, nor tell a client that only
// consumes from one that produces. The other Kafka clients, whose defaults
// are not idempotent: for sarama (IBM/sarama, Shopify/sarama), a
// sarama.NewConfig() given to NewSyncProducer or NewAsyncProducer, or to
// the sarama.NewClient (directly or through a variable) whose client
// NewSyncProducerFromClient or NewAsyncProducerFromClient is given
// (directly, through a variable, through a struct field the package's
// non-test files assign, as a publisher's config filled with the
// package's default, or returned by a function of the package; reported
// where it is made), or nil given to them, when nothing in the
// package sets Producer.Idempotent to anything but false; any assignment of
// false to Producer.Idempotent, or of NoResponse or WaitForLocal to
// Producer.RequiredAcks. For confluent-kafka-go, kafka.NewProducer given a
// ConfigMap written in the package (a literal, a variable assigned one,
// what a function of the package returns; not one a setting with a key
// not constant is written to, for k, v := range overrides { cfg[k] = v },
// which may hold any setting) when no ConfigMap of the package sets
// enable.idempotence (literal, SetKey or index); enable.idempotence set to
// false, acks or request.required.acks to 0 or 1. For segmentio/kafka-go,
// a Writer left with the zero RequiredAcks, which waits for no
// acknowledgement: a Writer literal without RequiredAcks, new(kafka.Writer),
// a variable declared var w kafka.Writer (not a pointer: var w
// *kafka.Writer holds a writer made elsewhere) and assigned nothing else,
// or a struct field of type kafka.Writer that the package writes through
// (p.w.WriteMessages) and never assigns, unexported or of package main
// (reported at its declaration), unless the package assigns a Writer's
// RequiredAcks elsewhere; and RequiredAcks set to RequireNone or
// RequireOne, in a literal or assigned after it (w.RequiredAcks =
// kafka.RequireOne: the assignment is reported, not the Writer it
// completes); and a
// WriterConfig, the config of the older NewWriter, whose RequiredAcks is
// set to 1 (the leader only), in a literal or assigned. NewWriter turns
// RequiredAcks 0, the zero value, into RequireAll, so a WriterConfig
// without it is not reported. The acks of these three clients are
// constants (a literal, a named constant of any package: const acks =
// kafka.RequireOne) or package-level variables given one in their
// declaration (var acks = sarama.WaitForLocal; also through another such
// variable, or converted, kafka.RequiredAcks(n)) that nothing in the
// package's non-test files writes again (an assignment, ++ or --, &acks
// as flag.IntVar takes it, a pointer method such as UnmarshalText); a
// local variable, a field or a variable assigned elsewhere is not
// followed. Test files
// are skipped: a test's producer writes test records, to a fake broker or
// with acks=0 on purpose. So are the client packages themselves (kgo,
// kafka-go, sarama, confluent-kafka-go): sarama's NewConfig sets its own
// defaults.
//
// idemretrykey: a key or event ID made inside a retry loop that also sends
// the operation. Keys are idemclient.NewKey, (*idemclient.Client).NewKey,
// event.NewID and event.New, which count with any send (http.Client.Do,
// http.Post, RoundTrip, (*idemclient.Client).Do, kgo Produce/ProduceSync,
// kafka-go WriteMessages, sarama SendMessage/SendMessages, confluent Produce,
// or a call of a function or method of the package that sends, directly
// or through others of the package),
// and the github.com/google/uuid constructors (New, NewString, NewRandom,
// NewUUID, NewV6, NewV7, their FromReader forms, NewDCE...: every function
// that makes a new UUID per call; github.com/gofrs/uuid's NewV1, NewV4,
// NewV6 and NewV7), which count only when their
// value is the key the loop sends: the value of Header.Set/Add of an
// Idempotency-Key (or X-Idempotency-Key) header or the key of
// idemclient.WithKey (also the
// argument of a function of the package that sets its parameter as the
// key, as charge(ctx, key, body) does), or, in a loop that sends, an event
// ID (a field named EventID of type string or UUID, event.Envelope's ID,
// in a composite literal or assigned), directly or
// computed from it (id.String(), a concatenation, a call's argument, an
// index or slice such as id[:] or id.String()[:8]) through local variables
// and struct fields the package assigns, since a UUID may be a per-attempt
// request ID. A key read from a parameter, from a field nothing in the
// package assigns (filled by rows.Scan, a decoder, another package) or
// from a field set from a parameter of a function the loop does not call
// is a stored key, made before the loop: only a UUID that is the key
// counts there. When the value cannot be followed (an element of a map or
// slice, a parameter of a setter the loop calls or of a function literal,
// a dereference), every UUID made in the loop counts, as the loop sets a
// key; a key put in a field through a pointer or by another package's
// function the loop calls is not seen. A
// retry loop is a for loop over a count or a condition, or an endless one;
// loops over a slice, map, channel or iterator, loops whose condition is a
// call or uses a len (also through a variable, n := len(s); i < n), range
// over a len (for i := range len(s)), and loops that receive or poll the next unit of work
// (v := <-ch, Recv, PollFetches, Accept, ..., or a tick of a time.Ticker
// or time.Tick: a periodic job) are item loops and are not checked;
// time.After and a time.Timer are a backoff between attempts. A retry
// loop also stops once an attempt succeeded: a loop with no way out but
// its count or on a failure makes one operation per count (for i := 0;
// i < n; i++ that returns or breaks only when err != nil) and is not
// checked. A way out is a return, a break of the loop, a labelled branch
// or goto out of it, or a condition reading a variable the loop sets
// (done, err; not a counter stepped by ++ or +=); it is taken on a
// failure in the then branch of an if, or a case of a switch without a
// tag, that tests err != nil (any error, ctx.Err() included) or calls
// errors.Is or errors.As (also in an operand of &&, or both of ||), in a
// select case receiving from ctx.Done(), and when it returns
// fmt.Errorf(...), errors.New(...), errors.Join(...), a composite literal
// or a package's error variable. A loop that makes one operation per
// count but leaves on a failure tested otherwise (a status code, then a
// bare return or return nil) is reported by mistake. A function of the
// package the loop calls that sets the key to one it makes itself, on
// every call (an API client's newRequest that does
// req.Header.Set("Idempotency-Key", uuid.NewString()), directly or through
// another function of the package), is reported at its call when the loop
// sets no key of its own; not when it reads the request's key first
// (Header.Get: a default for a request without one), nor when the key it
// sets cannot be followed. The operation that a retry library
// runs once per attempt is checked as a retry loop's body: the function
// literal (or a variable assigned one once) given to
// github.com/cenkalti/backoff's Retry, RetryNotify, RetryWithData, ...,
// github.com/avast/retry-go's Do and DoWithData, any major version, and
// github.com/sethvargo/go-retry's Do, DoValue, Constant, Exponential and
// Fibonacci.
//
// idemrandomid: uuid.New(), uuid.NewRandom() or uuid.NewString()
// (github.com/gofrs/uuid: uuid.NewV4()) (also through uuid.Must,
// .String(), a local variable, or a function of the package that returns
// one) stored in event.Envelope.ID (also through a struct that embeds
// event.Envelope) or in a field named EventID of type uuid.UUID (either
// package's) or string, by a composite
// literal (keyed or not) or an assignment. Test files are skipped: they build fixtures
// and check that v4 IDs are rejected. Other field names, values that pass
// through another package's functions or a function's parameters, and
// struct fields other than the event ID are not followed.
//
// idemtxwrite: in a func(http.ResponseWriter, *http.Request) that calls
// idemhttp.TxFromContext, a Commit or Rollback on the variable it returned
// (a call, or a method value such as commit := tx.Commit), and any Exec,
// Query, QueryRow, Begin, SendBatch or CopyFrom (and their Context forms)
// on a pgxpool.Pool or Conn, pgx.Conn, or sql.DB or Conn, and a
// pgx.BeginFunc or BeginTxFunc on a pgxpool.Pool or Conn or pgx.Conn (a
// transaction of its own; on the request's transaction it is a savepoint).
// Query and QueryRow calls whose constant SQL is a read are not reported: a
// SELECT (SHOW, VALUES, TABLE) without a locking clause (FOR UPDATE, FOR NO
// KEY UPDATE, FOR SHARE, FOR KEY SHARE: the lock would end with the pool's
// statement), a WITH without one and without INSERT, UPDATE, DELETE or
// MERGE, or an EXPLAIN without ANALYZE (which runs the statement), after
// any leading comments. The constant SQL of a call is its query argument
// (a Stmt's calls have none): a constant, or a variable (not a parameter)
// assigned one constant once (query := "SELECT ..."; a q += " FOR UPDATE" makes it
// unknown, and the call is reported).
// A call of a function or method of the package that does one of these
// writes through a pool, itself or through others of the package (a
// repository's s.store.Create(ctx, o) not given the transaction), is
// reported at the call. Handlers that take the transaction in a helper,
// or pass the pool to another package's function, are not seen.
//
// idemconsumer: a function (its function literals included) that calls
// PollFetches or PollRecords on a kgo.Client, FetchMessage or ReadMessage
// on a segmentio/kafka-go Reader, Messages on a sarama ConsumerGroupClaim
// or PartitionConsumer (a ConsumerGroupHandler's ConsumeClaim), or Poll or
// ReadMessage on a confluent-kafka-go Consumer, and Exec or ExecContext on a
// pgx, pgxpool or database/sql handle (or Query or QueryRow, and their
// Context forms, whose constant SQL writes: INSERT ... RETURNING, an
// UPDATE or DELETE, a WITH that modifies), itself or in a function or method of
// the package it hands the records to (called with a record, a fetch or a
// slice of records, or something derived from one: a field of it, a
// variable assigned from one or that a call given one fills in, as
// json.Unmarshal(m.Value, &o) fills o; or given as the function value that
// EachRecord calls; in such a function every parameter is the record's;
// followed up to four calls deep), when neither that
// function, nor those, nor anything of the package they call (up to four
// calls deep, record or not) uses the inbox or idemkafka packages, constant
// SQL (a literal, or a named constant of any package) with ON CONFLICT ...
// DO NOTHING or INSERT OR IGNORE, or calls a function or method (of any
// package) whose name says it deduplicates: dedup, processed, seen,
// duplicate, idempot, inbox (markProcessed, repo.AlreadySeen). Every such
// Exec is reported. Records handed over through an interface, a function
// value held in a field or variable, a channel or another goroutine's
// queue are not followed, nor is what is stored in a field of the
// receiver (c.last = m.Offset). A length (len(recs)), an error (a
// decode's) and a context are not derived from a record: a function given
// only those is not the consumer's.
//
// idemfloatmoney: a float32 or float64 (or pointer) struct field with a
// json or db tag, and a float variable or field passed to Exec, Query or
// QueryRow on a database handle, whose Go or tag name has a money word
// (amount, price, total, balance, cost, fee, money, sum) split at case
// changes and underscores, and no unit word (seconds, ratio, rate, count,
// ...). A struct field whose only money words are sum or total is not
// reported in a struct that has a field named as a statistic of
// measurements (Min, Max, Mean, Avg, Median, BucketCounts, Quantiles,
// P99, MaxMs: statistic and unit words only, so not a limit such as
// MaxItems, nor MinPrice): the sum of a histogram or a gauge
// snapshot; a sum of money beside such a field is missed. Nor is a field
// tagged "Total Cost" or "Startup Cost": the planner's cost estimate in
// PostgreSQL's EXPLAIN (FORMAT JSON), whatever its Go name. Untagged
// fields, local variables and computed arguments are not reported.
//
// idemautocommit: a kgo.NewClient whose options include
// kgo.ConsumerGroup(...) but neither kgo.DisableAutoCommit() nor
// kgo.AutoCommitMarks(), options followed as idemproducer follows them.
// franz-go's autocommit commits, every 5 seconds and when partitions are
// revoked, the offsets of the records a poll returned once the next poll
// has started, whether or not the database transaction that applied them
// committed: a record whose transaction failed (logged, and the loop polls
// on), or that another goroutine is still applying, is committed as done
// and lost. A loop that applies every record of a poll before it polls
// again, and stops on a failure, is at-least-once under autocommit: it is
// reported all the same, since the commits follow the polls, not the
// transactions. A client with options from elsewhere (a parameter, a field,
// what another package's function returns) is not reported: they may turn autocommit off.
// AutoCommitMarks commits only marked records and is not reported; whether
// the marks come after the commit is not checked. Also every call of
// ReadMessage on a segmentio/kafka-go Reader, which commits the message's
// offset when it returns it if the reader is in a group, except on a
// reader made by kafka.NewReader with a ReaderConfig literal that has no
// GroupID (or an empty one) and whose GroupID field the package never
// sets. Readers and configs are followed through variables, through the
// unexported struct fields the package assigns (every field of package
// main) and through what the package's functions return: every value
// assigned, every return, must be such a reader. A reader whose config is
// not seen (a parameter, a field nothing in the package assigns, an
// exported field another package may set, another package's function's
// result) is reported, even when it reads one partition without a group.
// Also kafka.NewConsumer of confluent-kafka-go given a ConfigMap of the
// package (as for kafka.NewProducer) with a group.id, when no ConfigMap
// of the package sets enable.auto.commit or enable.auto.offset.store to
// false (librdkafka
// stores each polled message's offset and commits it on a timer). These
// skip test files: a test's consumer commits test offsets.
// And, in any file, an offset commit or mark made by hand (kgo
// CommitRecords, CommitUncommittedOffsets, CommitMarkedOffsets,
// CommitOffsets, CommitOffsetsSync, MarkCommitRecords, MarkCommitOffsets;
// kafka-go CommitMessages; sarama's session MarkMessage, MarkOffset,
// Commit; confluent-kafka-go Commit,
// CommitMessage, CommitOffsets, StoreMessage, StoreOffsets) followed,
// later in the same block (the statements of a case of a switch or
// select are one: case msg := <-claim.Messages():), by a database write
// (Exec or ExecContext on a pgx, pgxpool or database/sql handle, a Query
// or QueryRow whose constant SQL writes, or Commit on a transaction of
// one), also one made in a function or method of the
// package the block calls (a handler, a repository, and what they call) or
// in a function literal a call of the block is given and runs (a
// transaction helper's callback, pgx.BeginFunc's; not time.AfterFunc's):
// the loop's offsets are committed before its records are applied. A
// commit in a branch of an if, or a case of a switch or select, that ends
// in a return, a continue or a panic (in an if, a break too) does not
// reach the write: a record skipped, marked as done, while the loop goes
// on. A deferred commit, one in a goroutine or a function literal, and a
// write made in another package (a repository of its own package) are not
// seen. Also an offset commit or mark later in a block that handed
// records to other goroutines (a channel send of a record, a worker
// pool's queue, also in a select; a go statement given a record or whose
// function literal uses one; also in a callback a call runs, as
// EachPartition's) without waiting for them since (a call of a
// method named Wait, as sync.WaitGroup's and errgroup's, or a receive
// from a channel): the workers may not have applied them.
//
// idemcheckinsert: in one function (its function literals included), a
// Query, QueryRow, QueryContext or QueryRowContext on a pgx, pgxpool or
// database/sql handle whose constant SQL is a SELECT (or a WITH that
// writes nothing) naming a dedup table after FROM or JOIN, subqueries
// included, followed in the source by an Exec, Query or QueryRow (or a
// Context form) whose constant SQL inserts into the same table without ON
// CONFLICT or INSERT OR IGNORE: two concurrent deliveries both find no row.
// Every such INSERT is reported. The read and the insert may also be in
// functions or methods of the package the function calls (repo.IsProcessed,
// then repo.MarkProcessed; followed three calls deep): the call that
// inserts is reported, naming both. Dedup tables go by name, compared in
// lower case without schema or quotes: inbox, any name ending in _inbox,
// any starting with processed_ (processed_events, processed_webhooks),
// idempotency (idempotency_keys, idempotency_records) or dedup, and
// webhook_event(s) alone or ending a name (stripe_webhook_events). Constant SQL is
// read as idemtxwrite reads it. Other names, SQL built at run time, and a
// check and an insert made through an interface or another package are not
// seen.
//
// idemstaticid: a consumer group instance ID (static membership) that is a
// non-empty constant string (a literal, a named constant of any package, a
// constant concatenation): the argument of kgo.InstanceID, the InstanceID
// field of an idemkafka.ConsumerConfig literal (keyed or not, any type
// argument), or an assignment to that field (also promoted through a
// struct that embeds the config). Every replica that runs the code would
// join with the same ID, and the broker fences all but the last to join:
// idemkafka.Consumer stops with ErrFenced, a plain kgo client takes the
// partitions back and is fenced in turn, for ever. An ID from a variable,
// a parameter, a field or a call (os.Getenv, os.Hostname, fmt.Sprintf,
// even with constant arguments) is not reported, nor is "". Test files
// are skipped: a test runs one consumer, or shares an ID on purpose to
// check the fencing. A constant ID in a program that only ever runs once
// at a time is reported by mistake.
package idemvet
