package idemkafka_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// The end-to-end run of issue 3: 10,000 business operations, each a
// PostgreSQL transaction that bumps an aggregate's version and enqueues one
// event in the outbox; two relays (SKIP LOCKED, each its own pool and
// idempotent producer) publishing through idemkafka.Publisher to a kfake
// broker over TCP (or the cluster of IDEM_TEST_KAFKA_SEEDS); a consumer
// group applying the events through the inbox into a plain "effect" table
// (no unique constraint: a double effect shows as an extra row).
//
// Injected along the way:
//   - relays crash after Kafka acknowledged a batch and before the rows are
//     marked published (the publisher panics; the relay's transaction rolls
//     back, its claim is released) and are restarted with a new pool and a
//     new producer: those events are published again with the same IDs;
//   - on kfake, produce requests time out now and then (the idempotent
//     producer retries them; the topic must not hold a record twice) and
//     offset commits fail now and then;
//   - a consumer process is killed (os.Exit) after its batch committed in
//     the database and before its offsets are committed, another one in the
//     middle of a batch's transaction; the group only notices at the end
//     of their session;
//   - a member joins and another leaves (rebalances) while events flow.
//
// A user would notice: every operation takes effect exactly once (10,000
// effect rows, 10,000 distinct events, 10,000 processed_event rows), every
// outbox row is published and none parked, and each aggregate's events take
// effect in version order, 1 to 100, none missing. The test also checks
// that the faults happened (records on the topic beyond 10,000, duplicates
// skipped by the inbox).
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	const (
		events     = 10_000
		keys       = 100
		partitions = 8
		producers  = 4
		consumer   = "billing"
		// Relays crash after these successful publishes (counted over both
		// relays), as long as there are that many batches.
		maxRelayCrashes = 6
	)
	relayCrashAt := []int64{4, 12, 30, 60, 110, 180}
	began := time.Now()
	// The run takes 20-60 s; the final wait below fails after 90 s
	// without progress: ctx only bounds a run that crawls on.
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()

	_, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	q := testdb.Pool(t, schema, 2) // the test's own queries
	if _, err := q.Exec(ctx, `CREATE TABLE aggregate (key text PRIMARY KEY, version int NOT NULL)`); err != nil {
		t.Fatalf("create aggregate table: %v", err)
	}

	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", partitions)
	group := kafkatest.Name("g")

	var produceFault, commitFault *kfake.FaultHandle
	if !kc.Real() {
		fake := kc.Fake(t)
		var produces, commits atomic.Int64
		// Every 100th produce request to the topic times out: the
		// idempotent producer, unsure whether the broker appended it,
		// retries it within its session (the broker deduplicates).
		produceFault = fake.Fault(kfake.Fault{
			Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut, Count: -1,
			When: func(kmsg.Request) bool { return produces.Add(1)%100 == 0 },
		})
		// Every 25th offset commit of the group fails, to the end: the
		// consumer retries it (the committed offsets must still reach the
		// end), and records redelivered meanwhile are skipped.
		commitFault = fake.Fault(kfake.Fault{
			Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.UnknownServerError, Count: -1,
			When: func(kmsg.Request) bool { return commits.Add(1)%25 == 0 },
		})
	}

	// --- Producers: one transaction per operation. ---
	var (
		jobs     = make(chan int, events)
		fed      int
		evMu     sync.Mutex
		evs      = make([]event.Envelope, 0, events)
		prodWG   sync.WaitGroup
		prodDone = make(chan struct{})
	)
	// The operations commit asynchronously (synchronous_commit off: they
	// do not wait for their WAL to reach the disk): what they commit is
	// visible at once all the same, and the test crashes relays and
	// consumers, never PostgreSQL. Waiting for the flush, they were the
	// whole run's pace: 80-180 operations/s on a loaded 2-core machine
	// (450-640/s without the wait), 15-23/s in a CI run that timed out.
	// The relays and the consumers commit as configured.
	prodDrv, err := pgdriver.New(testdb.PoolParams(t, schema, producers, map[string]string{"synchronous_commit": "off"}), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgdriver.New: %v", err)
	}
	for range producers {
		prodWG.Go(func() {
			for {
				var i int
				select {
				case <-ctx.Done():
					return
				case j, ok := <-jobs:
					if !ok {
						return
					}
					i = j
				}
				e, err := e2eOperation(ctx, prodDrv, fmt.Sprintf("order-%03d", i%keys))
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("operation %d: %v", i, err)
						cancel()
					}
					return
				}
				evMu.Lock()
				evs = append(evs, e)
				evMu.Unlock()
			}
		})
	}
	go func() { prodWG.Wait(); close(prodDone) }()
	feed := func(n int) {
		for range n {
			jobs <- fed
			fed++
		}
		if fed == events {
			close(jobs)
		}
	}

	// --- Relays: two of them, crashing after publishing now and then. ---
	var (
		relayWG       sync.WaitGroup
		publishes     atomic.Int64 // Publish calls that published their whole batch
		acked         atomic.Int64 // events the broker acknowledged, over all Publish calls
		marked        atomic.Int64 // events marked published (OnPublished)
		relayCrashes  atomic.Int64
		crashedEvents atomic.Int64 // events of the batches published but never marked
		crashSlots    atomic.Int64
		pubNanos      atomic.Int64 // time spent in Publish
		pubCalls      atomic.Int64
	)
	crashSlots.Store(maxRelayCrashes)
	// Events each relay marked published.
	relayMarked := map[string]*atomic.Int64{"relay-1": {}, "relay-2": {}}
	relayCtx, stopRelays := context.WithCancel(ctx)
	defer stopRelays()
	// runRelay runs one relay "process" until it crashes or relayCtx ends.
	runRelay := func(name string, drv driver.Driver[pgx.Tx]) (crashed bool) {
		pub, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Logger: testLogger()})
		if err != nil {
			t.Errorf("%s: NewPublisher: %v", name, err)
			return false
		}
		defer pub.Close()
		crashing := outbox.PublisherFunc(func(ctx context.Context, batch []event.Envelope) error {
			t0 := time.Now()
			err := pub.Publish(ctx, batch)
			pubNanos.Add(int64(time.Since(t0)))
			pubCalls.Add(1)
			acked.Add(int64(ackedOf(err, len(batch))))
			if err != nil {
				return err
			}
			if n := publishes.Add(1); slices.Contains(relayCrashAt, n) && crashSlots.Add(-1) >= 0 {
				relayCrashes.Add(1)
				crashedEvents.Add(int64(len(batch)))
				panic(relayCrash{}) // dies between the publish and the marks
			}
			return nil
		})
		relay, err := outbox.NewRelay(drv, crashing, &outbox.RelayConfig{
			BatchSize:    100,
			PollInterval: 10 * time.Millisecond,
			Backoff:      func(int) time.Duration { return 10 * time.Millisecond },
			OnPublished: func(evs []event.Envelope) {
				marked.Add(int64(len(evs)))
				relayMarked[name].Add(int64(len(evs)))
			},
			Logger: testLogger(),
		})
		if err != nil {
			t.Errorf("%s: NewRelay: %v", name, err)
			return false
		}
		defer func() {
			if p := recover(); p != nil {
				if _, ok := p.(relayCrash); !ok {
					panic(p)
				}
				crashed = true
			}
		}()
		if err := relay.Run(relayCtx); err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
		return false
	}
	for _, name := range []string{"relay-1", "relay-2"} {
		// A pool per incarnation, as a restarted process would have.
		drvs := make([]driver.Driver[pgx.Tx], maxRelayCrashes+1)
		for i := range drvs {
			drvs[i] = b.open(t)
		}
		relayWG.Go(func() {
			for _, drv := range drvs {
				if !runRelay(name, drv) || relayCtx.Err() != nil {
					return
				}
				time.Sleep(20 * time.Millisecond) // the supervisor restarts it
			}
		})
	}
	// Before the pools close, even when the test stops early.
	t.Cleanup(func() {
		cancel()
		prodWG.Wait()
		stopRelays()
		relayWG.Wait()
	})

	// --- Consumers. ---
	consumerCfg := func() idemkafka.ConsumerConfig[pgx.Tx] {
		cfg := consumerConfig(kc, b, consumer, group, nil, topic)
		cfg.MaxPollRecords = 200
		return cfg
	}
	members := map[string]*instance{}
	members["c1"] = start(t, b, consumer, consumerCfg())
	members["c2"] = start(t, b, consumer, consumerCfg())

	var children []*e2eChild
	diag := func() string {
		var sb strings.Builder
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		var rows, distinctIDs, unpublished, parked, outboxRows int
		_ = q.QueryRow(dctx, `SELECT count(*), count(DISTINCT event_id) FROM effect`).Scan(&rows, &distinctIDs)
		_ = q.QueryRow(dctx, `SELECT (SELECT count(*) FROM outbox), count(*), count(*) FILTER (WHERE parked_at IS NOT NULL) FROM outbox_pending`).Scan(&outboxRows, &unpublished, &parked)
		evMu.Lock()
		written := len(evs)
		evMu.Unlock()
		fmt.Fprintf(&sb, "\noperations fed %d, committed %d; outbox rows %d, unpublished %d, parked %d", fed, written, outboxRows, unpublished, parked)
		fmt.Fprintf(&sb, "\nrelays: %d full publishes, %d events acked, %d marked, %d crashes (%d events)",
			publishes.Load(), acked.Load(), marked.Load(), relayCrashes.Load(), crashedEvents.Load())
		fmt.Fprintf(&sb, "\neffects: %d rows, %d distinct events", rows, distinctIDs)
		fmt.Fprintf(&sb, "\nend offsets %v\ncommitted   %v", kc.EndOffsets(t, topic), kc.Committed(t, group, topic))
		if gs, err := kc.Admin().DescribeGroups(dctx, group); err == nil {
			g := gs[group]
			fmt.Fprintf(&sb, "\ngroup %s: state %s, %d members", group, g.State, len(g.Members))
		}
		for _, name := range slices.Sorted(maps.Keys(members)) {
			s := members[name].stats.get()
			fmt.Fprintf(&sb, "\n%s: %d batches, %d applied, %d duplicates, %d dead, %d rewound, %d failures, %d failed commits",
				name, s.batches, s.applied, s.duplicates, s.dead, s.rewound, s.failures, s.commitFailures)
		}
		for _, c := range children {
			fmt.Fprintf(&sb, "\nchild %s output:\n%s", c.name, c.output())
		}
		return sb.String()
	}
	waitUntil := func(timeout time.Duration, what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !cond() {
			if ctx.Err() != nil || time.Now().After(deadline) {
				t.Fatalf("after %s, still waiting for %s (%v)%s", time.Since(began).Round(time.Millisecond), what, ctx.Err(), diag())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// waitWhileProgress waits for cond as long as progress changed within the
	// last idle.
	waitWhileProgress := func(idle time.Duration, progress func() int64, what string, cond func() bool) {
		t.Helper()
		last, lastAt := progress(), time.Now()
		for !cond() {
			if ctx.Err() != nil || time.Since(lastAt) > idle {
				t.Fatalf("after %s, still waiting for %s, no progress for %s (%v)%s",
					time.Since(began).Round(time.Millisecond), what, time.Since(lastAt).Round(time.Millisecond), ctx.Err(), diag())
			}
			time.Sleep(100 * time.Millisecond)
			if p := progress(); p != last {
				last, lastAt = p, time.Now()
			}
		}
	}
	groupIs := func(n int) func() bool {
		return func() bool {
			gs, err := kc.Admin().DescribeGroups(ctx, group)
			if err != nil {
				return false
			}
			g := gs[group]
			return g.Err == nil && g.State == "Stable" && len(g.Members) == n
		}
	}
	spawn := func(name, mode string, after int) *e2eChild {
		t.Helper()
		c := spawnE2EChild(ctx, t, name, mode, after, kc, topic, group, schema)
		children = append(children, c)
		waitUntil(90*time.Second, name+" assigned partitions", func() bool {
			select {
			case <-c.assigned:
				return true
			case <-c.done:
				t.Fatalf("%s exited before it was assigned partitions: %v%s", name, c.err, diag())
			default:
			}
			return false
		})
		return c
	}
	mustCrash := func(c *e2eChild) {
		t.Helper()
		waitUntil(90*time.Second, c.name+" to reach its crash point", func() bool {
			select {
			case <-c.done:
				return true
			default:
				return false
			}
		})
		if ee, ok := errors.AsType[*exec.ExitError](c.err); !ok || ee.ExitCode() != crashExit {
			t.Fatalf("%s: %v; want exit status %d (its crash point)%s", c.name, c.err, crashExit, diag())
		}
	}

	// --- The run. ---
	phase := func(what string) {
		var n int
		_ = q.QueryRow(ctx, `SELECT count(*) FROM effect`).Scan(&n)
		t.Logf("%6s %s (%d operations fed, %d effects)", time.Since(began).Round(10*time.Millisecond), what, fed, n)
	}
	feed(3000)
	// A consumer process joins (a rebalance) and is killed after its batch
	// committed in the database, before its offsets are committed.
	x := spawn("child-after-db-commit", crashAfterDBCommit, 50)
	phase("first child assigned")
	feed(3000)
	mustCrash(x)
	phase("first killed consumer died")
	waitUntil(60*time.Second, "the group to notice the killed member", groupIs(2))
	phase("group without the killed member")
	// A member joins, another leaves.
	members["c3"] = start(t, b, consumer, consumerCfg())
	waitUntil(60*time.Second, "the group to take the new member", groupIs(3))
	phase("member joined")
	mustStop(t, members["c1"])
	waitUntil(60*time.Second, "the group to let the leaving member go", groupIs(2))
	phase("member left")
	// A consumer process is killed in the middle of a batch's transaction.
	y := spawn("child-before-db-commit", crashBeforeDBCommit, 30)
	feed(events - fed - keys*10)
	mustCrash(y)
	phase("second killed consumer died")
	feed(events - fed)

	var endOffsets map[int32]int64
	// The run's pace is the machine's: the wait lasts as long as the
	// operations, the effects and the committed offsets advance.
	progress := func() int64 {
		evMu.Lock()
		n := int64(len(evs))
		evMu.Unlock()
		var effects int64
		_ = q.QueryRow(ctx, `SELECT count(*) FROM effect`).Scan(&effects)
		n += effects
		for _, off := range kc.Committed(t, group, topic) {
			n += off
		}
		return n
	}
	waitWhileProgress(90*time.Second, progress, "every event applied and every offset committed", func() bool {
		select {
		case <-prodDone:
		default:
			return false
		}
		var distinctIDs, unpublished int
		if err := q.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM effect`).Scan(&distinctIDs); err != nil || distinctIDs < events {
			return false
		}
		if err := q.QueryRow(ctx, `SELECT count(*) FROM outbox_pending`).Scan(&unpublished); err != nil || unpublished > 0 {
			return false
		}
		endOffsets = kc.EndOffsets(t, topic)
		committed := kc.Committed(t, group, topic)
		for p, end := range endOffsets {
			if committed[p] != end {
				return false
			}
		}
		return true
	})
	phase("all applied and committed")
	stopRelays()
	relayWG.Wait()
	for _, name := range []string{"c2", "c3"} {
		mustStop(t, members[name])
	}
	elapsed := time.Since(began)
	if t.Failed() {
		t.Fatalf("failed during the run%s", diag())
	}

	// --- What a user would notice. ---
	if len(evs) != events {
		t.Fatalf("%d operations committed; want %d", len(evs), events)
	}
	mustOnce(t, b, consumer, evs) // exactly one effect per event, nothing else
	rows := b.rows(t, consumer)
	perKey := map[string][]int{}
	for _, r := range rows {
		perKey[r.Key] = append(perKey[r.Key], r.N)
	}
	if len(perKey) != keys {
		t.Errorf("effects for %d keys; want %d", len(perKey), keys)
	}
	for key, ns := range perKey {
		for i, n := range ns {
			if n != i+1 {
				t.Fatalf("key %s: effects applied in version order %v; want 1..%d in order", key, ns, events/keys)
			}
		}
		if len(ns) != events/keys {
			t.Errorf("key %s: %d effects; want %d", key, len(ns), events/keys)
		}
	}
	var outboxRows, unpublished, parked int
	if err := q.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox), count(*), count(*) FILTER (WHERE parked_at IS NOT NULL) FROM outbox_pending`).Scan(&outboxRows, &unpublished, &parked); err != nil {
		t.Fatalf("count outbox: %v", err)
	}
	if outboxRows != events || unpublished != 0 || parked != 0 || marked.Load() != events {
		t.Errorf("outbox: %d rows, %d unpublished, %d parked, %d marked published by the relays; want %d, 0, 0, %d",
			outboxRows, unpublished, parked, marked.Load(), events, events)
	}

	// --- The faults happened. ---
	var records int64
	for _, end := range endOffsets {
		records += end
	}
	if records != acked.Load() || acked.Load() != events+crashedEvents.Load() {
		t.Errorf("the topic holds %d records, the broker acknowledged %d; want both %d (every event once, plus the %d of the crashed relays' batches)",
			records, acked.Load(), events+crashedEvents.Load(), crashedEvents.Load())
	}
	if relayCrashes.Load() < 3 {
		t.Errorf("the relays crashed %d times after publishing; want at least 3", relayCrashes.Load())
	}
	var total totals
	for _, m := range members {
		s := m.stats.get()
		total.applied += s.applied
		total.duplicates += s.duplicates
		total.dead += s.dead
		total.commitFailures += s.commitFailures
		total.rewound += s.rewound
		total.batches += s.batches
	}
	if total.duplicates == 0 || total.dead != 0 {
		t.Errorf("the consumers skipped %d duplicates and dead-lettered %d; want some duplicates and no dead letter", total.duplicates, total.dead)
	}
	childApplied := events - total.applied
	if x.applied <= 0 || childApplied < x.applied {
		t.Errorf("the killed consumer committed %d effects, the in-process ones applied %d of %d", x.applied, total.applied, events)
	}
	if produceFault != nil && produceFault.Hits() == 0 {
		t.Errorf("no produce request failed")
	}

	t.Logf("relays: %d Publish calls (%s in all); relay-1 marked %d events, relay-2 %d",
		pubCalls.Load(), time.Duration(pubNanos.Load()).Round(time.Millisecond), relayMarked["relay-1"].Load(), relayMarked["relay-2"].Load())
	t.Logf("%d events in %s: %d records on the topic (%d republished after %d relay crashes), %d publishes; marked %d",
		events, elapsed.Round(time.Millisecond), records, records-events, relayCrashes.Load(), publishes.Load(), marked.Load())
	t.Logf("in-process consumers: %d records delivered in %d batches, %d applied, %d duplicates skipped, %d rewound, %d failed commits",
		total.applied+total.duplicates, total.batches, total.applied, total.duplicates, total.rewound, total.commitFailures)
	t.Logf("killed consumers applied %d (%s: %d committed before its offsets, %s: %d handler calls, the last rolled back)",
		childApplied, x.name, x.applied, y.name, y.applied)
	if produceFault != nil {
		t.Logf("kfake faults: %d produce requests failed, %d offset commits failed", produceFault.Hits(), commitFault.Hits())
	}
}

// relayCrash is the panic of a relay that dies between publishing a batch
// and marking it published.
type relayCrash struct{}

// ackedOf is how many events of a batch of n the publisher's result reports
// published.
func ackedOf(err error, n int) int {
	if err == nil {
		return n
	}
	pe, ok := errors.AsType[*outbox.PublishError](err)
	if !ok {
		return 0
	}
	acked := 0
	for _, e := range pe.Errs {
		if e == nil {
			acked++
		}
	}
	return acked
}

// e2eOperation is one business operation: it bumps the aggregate's version
// (the row lock orders the operations of one key) and enqueues the event
// carrying the new version, in one transaction.
func e2eOperation(ctx context.Context, drv driver.Driver[pgx.Tx], key string) (event.Envelope, error) {
	tx, err := drv.Begin(ctx)
	if err != nil {
		return event.Envelope{}, err
	}
	defer func() { _ = drv.Rollback(context.WithoutCancel(ctx), tx) }() // after Commit: a no-op
	var version int
	if err := tx.QueryRow(ctx, `INSERT INTO aggregate (key, version) VALUES ($1, 1)
		ON CONFLICT (key) DO UPDATE SET version = aggregate.version + 1 RETURNING version`, key).Scan(&version); err != nil {
		return event.Envelope{}, fmt.Errorf("bump %s: %w", key, err)
	}
	e, err := event.New("OrderChanged.v1", key, payload{N: version})
	if err != nil {
		return event.Envelope{}, err
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil {
		return event.Envelope{}, err
	}
	return e, drv.Commit(ctx, tx)
}

// --- The killed consumer processes. ---

const (
	envE2EChild   = "IDEMKAFKA_E2E_CHILD" // the crash point
	envE2ESeeds   = "IDEMKAFKA_E2E_SEEDS"
	envE2ETopic   = "IDEMKAFKA_E2E_TOPIC"
	envE2EGroup   = "IDEMKAFKA_E2E_GROUP"
	envE2ESchema  = "IDEMKAFKA_E2E_SCHEMA"
	envE2ESession = "IDEMKAFKA_E2E_SESSION"
	envE2EAfter   = "IDEMKAFKA_E2E_AFTER"
	// e2eMarker starts the lines the child prints for the parent.
	e2eMarker = "E2E-CHILD"
)

// e2eChild is a consumer running in a child process.
type e2eChild struct {
	name     string
	assigned chan struct{} // closed when it printed its first assignment
	done     chan struct{} // closed when it exited; err is then set
	err      error
	applied  int // from its last words

	mu  sync.Mutex
	out bytes.Buffer
}

func (c *e2eChild) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *e2eChild) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// spawnE2EChild starts TestCrashChildEndToEnd in a child process, which
// consumes with the group and dies (os.Exit) at the crash point mode once
// it has applied after events.
func spawnE2EChild(ctx context.Context, t *testing.T, name, mode string, after int, kc *kafkatest.Cluster, topic, group, schema string) *e2eChild {
	t.Helper()
	c := &e2eChild{name: name, assigned: make(chan struct{}), done: make(chan struct{})}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChildEndToEnd$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(),
		envE2EChild+"="+mode,
		envE2ESeeds+"="+strings.Join(kc.Seeds, ","),
		envE2ETopic+"="+topic,
		envE2EGroup+"="+group,
		envE2ESchema+"="+schema,
		envE2ESession+"="+kc.SessionTimeout().String(),
		envE2EAfter+"="+strconv.Itoa(after),
	)
	cmd.Stderr = c
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer close(c.done)
		var once sync.Once
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = fmt.Fprintln(c, line)
			switch {
			case strings.HasPrefix(line, e2eMarker+" assigned"):
				once.Do(func() { close(c.assigned) })
			case strings.HasPrefix(line, e2eMarker+" crash"):
				_, n, _ := strings.Cut(line, "applied=")
				c.applied, _ = strconv.Atoi(strings.TrimSpace(n))
			}
		}
		c.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
		<-c.done
	})
	return c
}

// TestCrashChildEndToEnd is the child process of TestEndToEnd: a consumer
// of the group that dies at its crash point.
func TestCrashChildEndToEnd(t *testing.T) {
	mode := os.Getenv(envE2EChild)
	if mode == "" {
		t.Skip("helper process of TestEndToEnd")
	}
	session, err := time.ParseDuration(os.Getenv(envE2ESession))
	if err != nil {
		t.Fatalf("%s: %v", envE2ESession, err)
	}
	after, err := strconv.Atoi(os.Getenv(envE2EAfter))
	if err != nil {
		t.Fatalf("%s: %v", envE2EAfter, err)
	}
	topic := os.Getenv(envE2ETopic)
	b := postgresAt(t, os.Getenv(envE2ESchema), false)
	cfg := consumerConfigAt(strings.Split(os.Getenv(envE2ESeeds), ","), b, "billing", os.Getenv(envE2EGroup), nil, topic)
	cfg.MaxPollRecords = 50
	cfg.ExtraOpts = append(cfg.ExtraOpts,
		kgo.SessionTimeout(session), kgo.HeartbeatInterval(session/10),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			if len(ps[topic]) > 0 {
				fmt.Printf("%s assigned %v\n", e2eMarker, ps[topic])
			}
		}),
	)
	var calls atomic.Int64 // handler calls; each wrote its effect in the transaction
	apply := cfg.Handler
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
		if err := apply(ctx, tx, e); err != nil {
			return err
		}
		if n := calls.Add(1); mode == crashBeforeDBCommit && n >= int64(after) {
			fmt.Printf("%s crash inside the transaction of event %s: applied=%d\n", e2eMarker, e.ID, n)
			os.Exit(crashExit) // the effect is written, the transaction open
		}
		return nil
	}
	var setup []func(*idemkafka.Consumer[pgx.Tx])
	switch mode {
	case crashAfterDBCommit:
		setup = append(setup, func(c *idemkafka.Consumer[pgx.Tx]) {
			idemkafka.SetBeforeCommit(c, func(rs []*kgo.Record) {
				if n := calls.Load(); n >= int64(after) {
					fmt.Printf("%s crash before committing the offsets of %d partitions: applied=%d\n", e2eMarker, len(rs), n)
					os.Exit(crashExit)
				}
			})
		})
	case crashBeforeDBCommit:
	default:
		t.Fatalf("unknown crash point %q", mode)
	}
	inst := start(t, b, "billing", cfg, setup...)
	select {
	case err := <-inst.done:
		t.Fatalf("Run returned %v before the crash point", err)
	case <-time.After(90 * time.Second):
		t.Fatal("the crash point was never reached")
	}
}
