package pgdriver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// recorder is an in-memory publisher that records what it receives.
type recorder struct {
	mu  sync.Mutex
	got []event.Envelope
	// block, if set, is called before recording (outside the lock).
	block func(events []event.Envelope)
}

func (r *recorder) Publish(_ context.Context, events []event.Envelope) error {
	if r.block != nil {
		r.block(events)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, events...)
	return nil
}

func (r *recorder) published() []event.Envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func newEvent(t testing.TB, key string, seq int) event.Envelope {
	t.Helper()
	e, err := event.New("Test.Happened.v1", key, map[string]int{"seq": seq})
	if err != nil {
		t.Fatalf("event.New: %v", err)
	}
	return e
}

func enqueue(t testing.TB, drv *pgdriver.Driver, events ...event.Envelope) {
	t.Helper()
	ctx := context.Background()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Errorf("Begin: %v", err)
		return
	}
	defer func() { _ = drv.Rollback(ctx, tx) }()
	if err := outbox.EnqueueTx(ctx, drv, tx, events...); err != nil {
		t.Errorf("EnqueueTx: %v", err)
		return
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Errorf("Commit: %v", err)
	}
}

func newRelay(t *testing.T, drv *pgdriver.Driver, pub outbox.Publisher, cfg *outbox.RelayConfig) *outbox.Relay[pgx.Tx] {
	t.Helper()
	r, err := outbox.NewRelay(drv, pub, cfg)
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	return r
}

// checkExactlyOnceInOrder checks that got holds every event of want once,
// and each key's events in want's order.
func checkExactlyOnceInOrder(t *testing.T, got []event.Envelope, want map[string][]uuid.UUID) {
	t.Helper()
	perKey := map[string][]uuid.UUID{}
	for _, e := range got {
		perKey[e.Key] = append(perKey[e.Key], e.ID)
	}
	for key, ids := range want {
		if !slices.Equal(perKey[key], ids) {
			t.Errorf("key %s: published %d events %v; want %d exactly once in enqueue order %v", key, len(perKey[key]), perKey[key], len(ids), ids)
		}
	}
	total := 0
	for _, ids := range want {
		total += len(ids)
	}
	if len(got) != total {
		t.Errorf("published %d events; want %d", len(got), total)
	}
}

// Two relays in two processes (two pools) run while events are enqueued:
// every event is published exactly once, each key in order.
func TestOutboxTwoRelaysTwoPools(t *testing.T) {
	t.Parallel()
	poolA, schema := testdb.Schema(t, 10)
	poolB := testdb.Pool(t, schema, 10)
	drvA := newDriver(t, poolA, &pgdriver.Config{Schema: schema})
	drvB := newDriver(t, poolB, &pgdriver.Config{Schema: schema})

	pub := &recorder{block: func([]event.Envelope) { time.Sleep(time.Millisecond) }}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	for _, d := range []*pgdriver.Driver{drvA, drvB} {
		relay := newRelay(t, d, pub, &outbox.RelayConfig{BatchSize: 7, PollInterval: 5 * time.Millisecond})
		wg.Go(func() {
			if err := relay.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}

	const keys, perKey = 8, 60
	want := map[string][]uuid.UUID{}
	for i := range perKey {
		var batch []event.Envelope
		for k := range keys {
			e := newEvent(t, fmt.Sprintf("key-%d", k), i)
			want[e.Key] = append(want[e.Key], e.ID)
			batch = append(batch, e)
		}
		enqueue(t, []*pgdriver.Driver{drvA, drvB}[i%2], batch...)
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(pub.published()) < keys*perKey && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a duplicate would show up now
	cancel()
	wg.Wait()
	checkExactlyOnceInOrder(t, pub.published(), want)
}

// laneOf returns the outbox lane of key (migration 006).
func laneOf(t *testing.T, drv *pgdriver.Driver, key string) int {
	t.Helper()
	var lane int
	if err := drv.Pool().QueryRow(t.Context(), `SELECT abs(hashtextextended($1, 0) % 64)`, key).Scan(&lane); err != nil {
		t.Fatal(err)
	}
	return lane
}

// keysInLanes returns n keys "<prefix>-i" of n distinct lanes, and one more
// key in the lane of the first.
func keysInLanes(t *testing.T, drv *pgdriver.Driver, prefix string, n int) (keys []string, sameLaneAsFirst string) {
	t.Helper()
	used := map[int]bool{}
	for i := 0; len(keys) < n || sameLaneAsFirst == ""; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		l := laneOf(t, drv, k)
		switch {
		case len(keys) > 0 && l == laneOf(t, drv, keys[0]) && sameLaneAsFirst == "":
			sameLaneAsFirst = k
		case !used[l] && len(keys) < n:
			used[l] = true
			keys = append(keys, k)
		}
	}
	return keys, sameLaneAsFirst
}

// While one relay publishes from a lane, another relay skips that lane
// entirely (every key in it, their later events too) and publishes the
// other lanes; once the first is done, the rest of the lane follows in
// order.
func TestOutboxHeldLaneIsSkipped(t *testing.T) {
	t.Parallel()
	poolA, schema := testdb.Schema(t, 5)
	drvA := newDriver(t, poolA, &pgdriver.Config{Schema: schema})
	drvB := newDriver(t, testdb.Pool(t, schema, 5), &pgdriver.Config{Schema: schema})
	ctx := t.Context()

	keys, twin := keysInLanes(t, drvA, "k", 2)
	x, y := keys[0], keys[1] // x and twin share a lane, y has another
	x1, x2, x3 := newEvent(t, x, 1), newEvent(t, x, 2), newEvent(t, x, 3)
	t1 := newEvent(t, twin, 1)
	y1, y2 := newEvent(t, y, 1), newEvent(t, y, 2)
	enqueue(t, drvA, x1)
	enqueue(t, drvA, y1, x2, t1, y2, x3)

	// Hold x's lane: a transaction that claimed x's head.
	tx, err := drvA.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drvA.Rollback(ctx, tx) }()
	var held []driver.OutboxRow
	// The claim starts at a random lane, so it takes x's lane first with a
	// probability of (distance from y's lane to x's)/64, as low as 1/64:
	// retry until it does.
	for range 2000 {
		if held, err = drvA.UnwrapExecutor(tx).OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: time.Now(), Limit: 1}); err != nil {
			t.Fatal(err)
		}
		if len(held) == 1 && held[0].Key == x {
			break
		}
		if err := drvA.Rollback(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if tx, err = drvA.Begin(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(held) != 1 || held[0].Key != x {
		t.Fatalf("a claim of 1 never took %s's head", x)
	}

	pub := &recorder{}
	relayB := newRelay(t, drvB, pub, nil)
	n, err := relayB.RunOnce(ctx)
	if err != nil {
		t.Fatalf("relay B: %v", err)
	}
	if got := pub.published(); n != 2 || !slices.Equal(obIDsOf(got), []uuid.UUID{y1.ID, y2.ID}) {
		t.Errorf("while %s's lane is held elsewhere, relay B published %d: %v; want %s's two events only", x, n, obIDsOf(got), y)
	}
	if err := drvA.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if n, err := relayB.RunOnce(ctx); n != 4 || err != nil {
		t.Errorf("after the lane was released, relay B published %d, %v; want the lane's 4 events", n, err)
	}
	checkExactlyOnceInOrder(t, pub.published(), map[string][]uuid.UUID{
		x: {x1.ID, x2.ID, x3.ID}, twin: {t1.ID}, y: {y1.ID, y2.ID},
	})
}

// With a poll interval of an hour, LISTEN/NOTIFY gets every committed event
// published (the time it took is logged, not asserted: a loaded machine
// must not fail the test).
func TestOutboxNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	wake, err := drv.ListenOutbox(ctx, func(err error) { t.Errorf("listener: %v", err) })
	if err != nil {
		t.Fatalf("ListenOutbox: %v", err)
	}
	published := make(chan time.Time, 10)
	relay := newRelay(t, drv, &recorder{}, &outbox.RelayConfig{
		PollInterval: time.Hour, // a publish can only come from a wake-up
		Wake:         wake,
		OnPublished:  func([]event.Envelope) { published <- time.Now() },
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(ctx)
	}()
	time.Sleep(100 * time.Millisecond) // the relay's first round is over: it now waits an hour

	var latencies []time.Duration
	for i := range 5 {
		committed := time.Now()
		enqueue(t, drv, newEvent(t, "order-1", i))
		select {
		case at := <-published:
			latencies = append(latencies, at.Sub(committed))
		case <-time.After(30 * time.Second):
			t.Fatalf("event %d not published 30s after its commit (poll interval 1h): no wake-up", i)
		}
	}
	slices.Sort(latencies)
	t.Logf("Enqueue (begin..commit) -> published, 5 runs with PollInterval 1h: min %s, median %s, max %s",
		latencies[0], latencies[2], latencies[4])
	cancel()
	<-done
}

var _ outbox.Notifier = (*pgdriver.Driver)(nil)

// A relay without RelayConfig.Wake finds the driver's LISTEN/NOTIFY itself:
// with an hour's poll interval, committed events are still published
// (a snippet that forgets the wake-up does not poll once a second).
func TestOutboxRelayListensByItself(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	published := make(chan time.Time, 10)
	relay := newRelay(t, drv, &recorder{}, &outbox.RelayConfig{
		PollInterval: time.Hour, // a publish can only come from a wake-up
		OnPublished:  func([]event.Envelope) { published <- time.Now() },
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(ctx)
	}()
	time.Sleep(100 * time.Millisecond) // listening, first round over: it now waits an hour
	for i := range 3 {
		committed := time.Now()
		enqueue(t, drv, newEvent(t, "order-1", i))
		select {
		case at := <-published:
			t.Logf("event %d published %s after its commit", i, at.Sub(committed))
		case <-time.After(30 * time.Second):
			t.Fatalf("event %d not published 30s after its commit (poll interval 1h): the relay did not listen", i)
		}
	}
	cancel()
	<-done
}

// A notification is sent on commit only, and only when a row was new.
func TestOutboxNotifyOnCommitOfNewRows(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	wake, err := drv.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatalf("ListenOutbox: %v", err)
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case <-wake:
			t.Errorf("%s: the relay was woken", what)
		case <-time.After(150 * time.Millisecond):
		}
	}
	woken := func(what string) {
		t.Helper()
		select {
		case <-wake:
		case <-time.After(30 * time.Second):
			t.Errorf("%s: no wake-up within 30s", what)
		}
	}
	quiet("after LISTEN")

	e := newEvent(t, "k", 1)
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil {
		t.Fatal(err)
	}
	quiet("enqueue not committed yet")
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	quiet("enqueue rolled back")

	enqueue(t, drv, e)
	woken("enqueue committed")
	enqueue(t, drv, e)
	quiet("duplicate enqueue committed")
}

// The listener survives the loss of its connection: it reconnects, says so
// (the error, then nil), and keeps delivering wake-ups.
func TestOutboxListenerReconnects(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	errs := make(chan error, 10)
	wake, err := drv.ListenOutbox(ctx, func(err error) { errs <- err })
	if err != nil {
		t.Fatalf("ListenOutbox: %v", err)
	}
	// Kill the listener's backend, as a failover or an idle-killer would.
	var killed int
	err = drv.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND query LIKE 'LISTEN %' AND query LIKE '%' || $1 || '%'`,
		drv.OutboxChannel()).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminate listener: %d backends, %v; want 1", killed, err)
	}
	select {
	case err := <-errs:
		t.Logf("listener reported: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("listener did not report the lost connection")
	}
	select { // the reconnection signal: events committed meanwhile are looked for
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Fatal("no wake-up after reconnecting")
	}
	// And the end of the errors, for the caller's log.
	for reported := true; reported; {
		select {
		case err := <-errs:
			reported = err != nil
		case <-time.After(30 * time.Second):
			t.Fatal("the listener did not report its reconnection (onError(nil))")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		enqueue(t, drv, newEvent(t, "k", int(time.Now().UnixNano())))
		select {
		case <-wake:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no wake-up for commits after reconnecting")
		}
	}
}

// The PostgreSQL claim locks rows: outside a transaction it would release
// them at once, so it refuses.
func TestOutboxClaimNeedsTransaction(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	if _, err := drv.Executor().OutboxClaimBatch(t.Context(), &driver.OutboxClaimBatchParams{Now: time.Now(), Limit: 10}); err == nil ||
		!strings.Contains(err.Error(), "transaction") {
		t.Errorf("OutboxClaimBatch outside a transaction = %v; want an error", err)
	}
}

func TestOutboxChannel(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.Schema(t, 2)
	name := func(cfg *pgdriver.Config) string {
		d, err := pgdriver.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return d.OutboxChannel()
	}
	for _, tc := range []struct {
		cfg  *pgdriver.Config
		want string
	}{
		{nil, "idem_outbox"},
		{&pgdriver.Config{TablePrefix: "app_"}, "app_idem_outbox"},
		{&pgdriver.Config{Schema: "billing", TablePrefix: "app_"}, "billing.app_idem_outbox"},
	} {
		if got := name(tc.cfg); got != tc.want {
			t.Errorf("OutboxChannel(%+v) = %q; want %q", tc.cfg, got, tc.want)
		}
	}
	long1 := name(&pgdriver.Config{Schema: strings.Repeat("s", 40), TablePrefix: strings.Repeat("p", 39) + "_"})
	long2 := name(&pgdriver.Config{Schema: strings.Repeat("s", 40), TablePrefix: strings.Repeat("q", 39) + "_"})
	if len(long1) > 63 || long1 == long2 || !strings.HasPrefix(long1, "idem_outbox_") {
		t.Errorf("long channel names %q, %q; want distinct names of at most 63 bytes", long1, long2)
	}
}

// Row IDs are given at INSERT, not at COMMIT: two transactions that enqueue
// for one key without serialising on the aggregate (see package outbox) can
// commit in the opposite order of their IDs. The relay then publishes in
// commit order: the higher ID, committed first, is published before the
// lower one exists for it, and the lower one, once committed, is published
// too (it is not stuck behind its already published successor, nor
// skipped).
func TestOutboxLowerIDCommittedLate(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	first, second := newEvent(t, "K", 1), newEvent(t, "K", 2)

	tx1, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drv.Rollback(ctx, tx1) }()
	if err := outbox.EnqueueTx(ctx, drv, tx1, first); err != nil { // gets the lower ID
		t.Fatal(err)
	}
	enqueue(t, drv, second) // higher ID, committed first

	pub := &recorder{}
	relay := newRelay(t, drv, pub, nil)
	if n, err := relay.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RunOnce with the lower ID uncommitted = %d, %v; want the committed event", n, err)
	}
	if err := drv.Commit(ctx, tx1); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RunOnce after the lower ID committed = %d, %v; want it published", n, err)
	}
	got := pub.published()
	if len(got) != 2 || got[0].ID != second.ID || got[1].ID != first.ID {
		t.Errorf("published %v; want commit order [%s %s]", obIDsOf(got), second.ID, first.ID)
	}
	if _, ok, err := drv.Executor().OutboxOldestUnpublished(ctx); ok || err != nil {
		t.Errorf("an event is left unpublished (%v)", err)
	}
}

// Enqueued after the business write that locks the aggregate, as package
// outbox asks, concurrent transactions of one key get their IDs in commit
// order, and the relay publishes them in enqueue order.
func TestOutboxAggregateLockGivesIDsInCommitOrder(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 10)
	drv := newDriver(t, pool, &pgdriver.Config{Schema: schema})
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `CREATE TABLE aggregate (id text PRIMARY KEY, version int NOT NULL);
		INSERT INTO aggregate VALUES ('K', 0)`); err != nil {
		t.Fatal(err)
	}
	const writers = 8
	var (
		mu    sync.Mutex
		order []uuid.UUID // in commit order
		wg    sync.WaitGroup
	)
	for i := range writers {
		wg.Go(func() {
			tx, err := drv.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer func() { _ = drv.Rollback(ctx, tx) }()
			if _, err := tx.Exec(ctx, `UPDATE aggregate SET version = version + 1 WHERE id = 'K'`); err != nil {
				t.Error(err)
				return
			}
			e := newEvent(t, "K", i)
			if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
			mu.Lock() // held across COMMIT: order is the commit order
			defer mu.Unlock()
			if err := drv.Commit(ctx, tx); err != nil {
				t.Error(err)
				return
			}
			order = append(order, e.ID)
		})
	}
	wg.Wait()
	pub := &recorder{}
	relay := newRelay(t, drv, pub, nil)
	if n, err := relay.RunOnce(ctx); n != writers || err != nil {
		t.Fatalf("RunOnce = %d, %v; want %d", n, err, writers)
	}
	checkExactlyOnceInOrder(t, pub.published(), map[string][]uuid.UUID{"K": order})
}

func obIDsOf(es []event.Envelope) []uuid.UUID {
	ids := make([]uuid.UUID, len(es))
	for i, e := range es {
		ids[i] = e.ID
	}
	return ids
}

// A claim reads lanes: every claimable row when the limit allows, the first
// rows of each key otherwise, a backing-off or parked head blocking its key
// only; and a second transaction finds nothing while the first holds the
// lanes.
func TestOutboxClaimLanes(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var rows []driver.OutboxRow
	for i := range 40 {
		key := fmt.Sprintf("k%d", i%7)
		e, err := event.New("Test.v1", key, map[string]int{"seq": i})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, driver.OutboxRow{EventID: e.ID, EventType: e.Type, Key: e.Key, OccurredAt: e.OccurredAt, Payload: e.Payload, CreatedAt: now})
	}
	if _, err := drv.Executor().OutboxInsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	// k1's head backs off, k2's head is parked.
	var k1, k2 int64
	if err := drv.Pool().QueryRow(ctx, `SELECT min(id) FILTER (WHERE record_key = 'k1'), min(id) FILTER (WHERE record_key = 'k2') FROM outbox`).Scan(&k1, &k2); err != nil {
		t.Fatal(err)
	}
	if err := drv.Executor().OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: k1, Error: "later", NextAttempt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := drv.Executor().OutboxPark(ctx, &driver.OutboxParkParams{ID: k2, Error: "poison", At: now}); err != nil {
		t.Fatal(err)
	}
	r, err := drv.Pool().Query(ctx, `SELECT id FROM outbox WHERE record_key NOT IN ('k1', 'k2') ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgx.CollectRows(r, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	claim := func(tx pgx.Tx, limit int) []int64 {
		t.Helper()
		got, err := drv.UnwrapExecutor(tx).OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: now, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int64, len(got))
		for i, r := range got {
			ids[i] = r.ID
		}
		return ids
	}
	for i := range 3 {
		tx1, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := claim(tx1, 100); !slices.Equal(got, want) {
			t.Errorf("claim %d: %v; want %v", i, got, want)
		}
		tx2, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := claim(tx2, 100); len(got) != 0 {
			t.Errorf("claim %d while another transaction holds the lanes: %v; want none", i, got)
		}
		_ = drv.Rollback(ctx, tx2)
		_ = drv.Rollback(ctx, tx1)
	}
}

// With OutboxDeletePublished the relay deletes what it published: the same
// events, in order, once each; nothing is left to redrive, and Redrive says
// so instead of reporting 0 rows.
func TestOutboxDeletePublished(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 5)
	drv := newDriver(t, pool, &pgdriver.Config{Schema: schema, OutboxDeletePublished: true})
	ctx := t.Context()
	want := map[string][]uuid.UUID{}
	for i := range 30 {
		e := newEvent(t, fmt.Sprintf("k%d", i%4), i)
		want[e.Key] = append(want[e.Key], e.ID)
		enqueue(t, drv, e)
	}
	pub := &recorder{}
	relay := newRelay(t, drv, pub, &outbox.RelayConfig{BatchSize: 7})
	drain(t, relay)
	checkExactlyOnceInOrder(t, pub.published(), want)
	var rows int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+schema+`.outbox) + (SELECT count(*) FROM `+schema+`.outbox_pending)
		+ (SELECT count(*) FROM `+schema+`.outbox_published)`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("the outbox tables hold %d rows after the relay; want none", rows)
	}
	if _, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{}); err == nil {
		t.Error("Redrive succeeded with published rows deleted; want an error")
	}
}

// migratedTo returns a driver on a fresh schema holding idem's migrations up
// to version only, applied by hand as an older release left them.
func migratedTo(t *testing.T, version int) *pgdriver.Driver {
	t.Helper()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 10)
	drv := newBareDriver(t, pool, &pgdriver.Config{Schema: schema})
	if _, err := pool.Exec(ctx, drv.MigrationTableSQL()); err != nil {
		t.Fatal(err)
	}
	ms, err := drv.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Version > version {
			break
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+drv.Table("idem_migration")+` (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		}); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
	}
	return drv
}

// An outbox left by an older release, before the lanes (version 5) or
// before the pending table (version 7), keeps every row through the
// migrations: its pending rows are relayed, each key in order; a parked row
// stays parked (its attempts and error kept) and blocks its key; a row that
// was backing off keeps its attempts; published rows keep their time, so
// redrive and cleanup find them.
func TestOutboxMigrationsKeepRows(t *testing.T) {
	t.Parallel()
	for _, from := range []int{5, 7} {
		t.Run(fmt.Sprint("from ", from), func(t *testing.T) {
			t.Parallel()
			drv := migratedTo(t, from)
			ctx := t.Context()
			now := time.Now()
			publishedAt := now.Add(-2 * time.Hour).Truncate(time.Microsecond)
			want := map[string][]uuid.UUID{}
			// insert writes a row as the old drivers did: the delivery
			// state in the outbox row itself.
			insert := func(key string, seq int, publishedAt *time.Time, attempts int, nextAttempt, parked *time.Time) uuid.UUID {
				e := newEvent(t, key, seq)
				var lastErr *string
				if attempts > 0 {
					s := fmt.Sprint("failure ", attempts)
					lastErr = &s
				}
				if _, err := drv.Pool().Exec(ctx, `INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at,
					published_at, attempts, last_error, next_attempt_at, parked_at)
					VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
					e.ID, e.Type, e.Key, e.Payload, e.OccurredAt, now, publishedAt, attempts, lastErr, nextAttempt, parked); err != nil {
					t.Fatal(err)
				}
				return e.ID
			}
			var published []uuid.UUID
			for i := range 3 {
				published = append(published, insert("old", i, &publishedAt, 0, nil, nil))
			}
			past := now.Add(-time.Minute)
			want["retry"] = []uuid.UUID{insert("retry", 0, nil, 2, &past, nil), insert("retry", 1, nil, 0, nil, nil)}
			parked := insert("parked", 0, nil, 5, nil, &past)
			blocked := insert("parked", 1, nil, 0, nil, nil)
			for i := range 60 {
				k := fmt.Sprintf("k%d", i%7)
				want[k] = append(want[k], insert(k, i, nil, 0, nil, nil))
			}

			if err := drv.Migrate(ctx); err != nil {
				t.Fatalf("migrate: %v", err)
			}
			pub := &recorder{}
			relay := newRelay(t, drv, pub, &outbox.RelayConfig{BatchSize: 9})
			drain(t, relay)
			checkExactlyOnceInOrder(t, pub.published(), want)

			// The parked row and the row it blocks are still pending,
			// with their state.
			type pendingRow struct {
				EventID  uuid.UUID
				Attempts int
				LastErr  *string
				Parked   bool
			}
			rows, err := drv.Pool().Query(ctx, `SELECT o.event_id, p.attempts, p.last_error, p.parked_at IS NOT NULL
				FROM outbox_pending p JOIN outbox o USING (id) ORDER BY p.id`)
			if err != nil {
				t.Fatal(err)
			}
			left, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pendingRow])
			if err != nil {
				t.Fatal(err)
			}
			if len(left) != 2 || left[0].EventID != parked || left[0].Attempts != 5 || left[0].LastErr == nil ||
				*left[0].LastErr != "failure 5" || !left[0].Parked || left[1].EventID != blocked || left[1].Parked {
				t.Fatalf("pending after the relay: %+v; want the parked row (5 attempts) and the row it blocks", left)
			}

			// The old published rows kept their time: a redrive since it
			// republishes them, in order; one since a second after it
			// finds none of them.
			if n, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{Since: publishedAt.Add(time.Second), Keys: []string{"old"}}); err != nil || n != 0 {
				t.Fatalf("Redrive after the old rows' time = %d, %v; want 0", n, err)
			}
			n, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{Since: publishedAt, Keys: []string{"old"}})
			if err != nil || n != 3 {
				t.Fatalf("Redrive of the old window = %d, %v; want 3", n, err)
			}
			pub2 := &recorder{}
			drain(t, newRelay(t, drv, pub2, &outbox.RelayConfig{BatchSize: 9}))
			checkExactlyOnceInOrder(t, pub2.published(), map[string][]uuid.UUID{"old": published})

			// Cleanup deletes the published rows, never the pending ones.
			res, err := drv.Executor().OutboxDeletePublishedBefore(ctx, &driver.OutboxDeletePublishedBeforeParams{Before: time.Now().Add(time.Hour), Limit: 1000})
			if err != nil || res.Deleted != 3+2+60 {
				t.Fatalf("cleanup deleted %d, %v; want %d", res.Deleted, err, 3+2+60)
			}
			var outboxRows, pendingRows, logRows int
			if err := drv.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_pending),
				(SELECT count(*) FROM outbox_published)`).Scan(&outboxRows, &pendingRows, &logRows); err != nil {
				t.Fatal(err)
			}
			if outboxRows != 2 || pendingRows != 2 || logRows != 0 {
				t.Errorf("after cleanup: %d outbox rows, %d pending, %d published; want 2, 2, 0", outboxRows, pendingRows, logRows)
			}
		})
	}
}

// A replica of an earlier release enqueues while migration 008 starts (a
// rolling upgrade): its transaction commits while the migration runs, and
// its event is published all the same. (Without the migration's table lock
// the move's snapshot missed the event, the trigger did not exist yet, and
// the event got neither a pending nor a publication row.)
func TestOutboxMigrationWithConcurrentEnqueue(t *testing.T) {
	t.Parallel()
	drv := migratedTo(t, 7)
	ctx := t.Context()
	now := time.Now()
	insert := func(q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, seq int) uuid.UUID {
		e := newEvent(t, "k", seq)
		if _, err := q.Exec(ctx, `INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
			VALUES ($1, $2, $3, $4, $5, $6)`, e.ID, e.Type, e.Key, e.Payload, e.OccurredAt, now); err != nil {
			t.Fatal(err)
		}
		return e.ID
	}
	before := insert(drv.Pool(), 0)
	tx, err := drv.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	during := insert(tx, 1)
	migrated := make(chan error, 1)
	go func() { migrated <- drv.Migrate(ctx) }()
	// The migration waits for a lock on outbox, which the enqueue holds.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting int
		if err := drv.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE NOT granted AND relation = to_regclass('outbox')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			_ = tx.Rollback(ctx)
			t.Fatal("the migration never waited for the enqueue's lock")
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("migrate: %v", err)
	}
	pub := &recorder{}
	drain(t, newRelay(t, drv, pub, &outbox.RelayConfig{BatchSize: 9}))
	checkExactlyOnceInOrder(t, pub.published(), map[string][]uuid.UUID{"k": {before, during}})
}

// An event inserted into outbox by plain SQL, as a replica of an earlier
// release still running during a rolling upgrade would (its statement
// writes no pending row), is published all the same: the pending row comes
// from migration 008's trigger. With a table prefix and the schema given
// either in the Config or by the pool's search_path only; the plain
// inserts come from a session whose search_path is another schema.
func TestOutboxPlainInsertIsPublished(t *testing.T) {
	t.Parallel()
	for _, inConfig := range []bool{true, false} {
		t.Run(fmt.Sprint("schema in config ", inConfig), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool, schema := testdb.Schema(t, 10)
			cfg := &pgdriver.Config{TablePrefix: "app_"}
			if inConfig {
				cfg.Schema = schema
			}
			drv := newBareDriver(t, pool, cfg)
			if err := drv.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			other := testdb.Pool(t, "public", 2)
			want := map[string][]uuid.UUID{}
			var evs []event.Envelope
			for i := range 5 {
				evs = append(evs, newEvent(t, "k", i))
				want["k"] = append(want["k"], evs[i].ID)
			}
			enqueue(t, drv, evs[0])
			for _, e := range evs[1:4] {
				if _, err := other.Exec(ctx, `INSERT INTO `+schema+`.app_outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
					VALUES ($1, $2, $3, $4, $5, now())`, e.ID, e.Type, e.Key, e.Payload, e.OccurredAt); err != nil {
					t.Fatal(err)
				}
			}
			enqueue(t, drv, evs[4])
			// A repeated event ID inserts nothing and adds no pending row.
			enqueue(t, drv, evs[2])
			var pending int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+drv.Table("outbox_pending")).Scan(&pending); err != nil || pending != 5 {
				t.Fatalf("%d pending rows, %v; want 5", pending, err)
			}
			pub := &recorder{}
			drain(t, newRelay(t, drv, pub, nil))
			checkExactlyOnceInOrder(t, pub.published(), want)
		})
	}
}

// Events deleted from outbox in SQL (an operator dropping a key's events)
// take their pending rows with them: a key with more events than a batch,
// deleted, does not stop the other keys of its lane. TRUNCATE empties the
// pending rows and the publication log too.
func TestOutboxDeletedEventsLeaveNoPendingRows(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	keys, sameLane := keysInLanes(t, drv, "d", 1)
	var dropped []event.Envelope
	for i := range 30 {
		dropped = append(dropped, newEvent(t, keys[0], i))
	}
	enqueue(t, drv, dropped...)
	want := map[string][]uuid.UUID{}
	var kept []event.Envelope
	for i := range 3 {
		kept = append(kept, newEvent(t, sameLane, i))
		want[sameLane] = append(want[sameLane], kept[i].ID)
	}
	enqueue(t, drv, kept...)
	if _, err := drv.Pool().Exec(ctx, `DELETE FROM outbox WHERE record_key = $1`, keys[0]); err != nil {
		t.Fatal(err)
	}
	count := func(table string) int {
		t.Helper()
		var n int
		if err := drv.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count("outbox_pending"); n != 3 {
		t.Fatalf("%d pending rows after the delete, want 3", n)
	}
	pub := &recorder{}
	// Batches of 10: with the deleted key's 30 pending rows left at the
	// head of the lane, no claim would reach the kept key.
	drain(t, newRelay(t, drv, pub, &outbox.RelayConfig{BatchSize: 10}))
	checkExactlyOnceInOrder(t, pub.published(), want)

	for _, q := range []string{`TRUNCATE outbox`, `TRUNCATE outbox, outbox_pending, outbox_published`} {
		enqueue(t, drv, newEvent(t, keys[0], 99))
		if _, err := drv.Pool().Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if p, l := count("outbox_pending"), count("outbox_published"); p != 0 || l != 0 {
			t.Errorf("after %s: %d pending rows, %d published; want none", q, p, l)
		}
	}
}

// Lanes whose only pending rows are parked are not claimed: with more such
// lanes than a claim takes, the one healthy key is still found at the
// first claim.
func TestOutboxParkedLanesNotClaimed(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	keys, _ := keysInLanes(t, drv, "p", 25)
	for i, k := range keys[:24] {
		e := newEvent(t, k, i)
		enqueue(t, drv, e)
		var id int64
		if err := drv.Pool().QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1`, e.ID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if err := drv.Executor().OutboxPark(ctx, &driver.OutboxParkParams{ID: id, Error: "poison", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	healthy := newEvent(t, keys[24], 0)
	enqueue(t, drv, healthy)
	for i := range 5 {
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := drv.UnwrapExecutor(tx).OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: time.Now(), Limit: 500})
		_ = drv.Rollback(ctx, tx)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].EventID != healthy.ID {
			t.Fatalf("claim %d with 24 parked lanes: %d rows; want the healthy key's one", i, len(got))
		}
	}
}

// drain runs the relay's rounds until one publishes nothing.
func drain(t *testing.T, relay *outbox.Relay[pgx.Tx]) {
	t.Helper()
	for {
		n, err := relay.RunOnce(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// Without Config.Schema, the listener finds the outbox's schema as the
// pool's connections do, also when their search_path is set by the pool's
// AfterConnect hook, which the listener's own connection (opened from the
// pool's ConnConfig) does not run: a relay that listened first must still
// listen on the channel the enqueuers notify (and take their lane locks).
func TestListenOutboxSearchPathFromAfterConnect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, schema := testdb.Schema(t, 1)
	cfg, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET search_path TO "+pgx.Identifier{schema}.Sanitize())
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	enqueuer, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := enqueuer.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	relay, err := pgdriver.New(pool, nil) // a relay process: it listens first
	if err != nil {
		t.Fatal(err)
	}
	wake, err := relay.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	select { // the signal of the first connection, if any
	case <-wake:
	default:
	}
	if got, want := relay.OutboxChannel(), enqueuer.OutboxChannel(); got != want {
		t.Errorf("OutboxChannel of a driver whose pool sets search_path = %q, want %q (the schema its tables are in)", got, want)
	}
	enqueue(t, enqueuer, newEvent(t, "k", 1))
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Error("the listener was not woken by an enqueue into the schema its pool's search_path names")
	}
}

// OutboxCountParked reads the index of the rows that failed, not the
// pending rows, however many there are; an event unparked with the
// runbook's statement (docs/operations.md) leaves the count at once, and
// the relay then publishes it.
func TestOutboxCountParkedReadsTheFailedRows(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	pool := drv.Pool()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
		SELECT gen_random_uuid(), 'Test.Happened.v1', 'k' || (n % 500), '\x7b7d', now(), now()
		FROM generate_series(1, 5000) n`); err != nil {
		t.Fatal(err)
	}
	poison := []event.Envelope{newEvent(t, "p1", 0), newEvent(t, "p2", 0), newEvent(t, "p3", 0)}
	enqueue(t, drv, poison...)
	for _, e := range poison {
		var id int64
		if err := pool.QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1`, e.ID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if err := drv.Executor().OutboxPark(ctx, &driver.OutboxParkParams{ID: id, Error: "poison", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox_pending`); err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	rows, err := pool.Query(ctx, `EXPLAIN `+strings.ReplaceAll(pgsql.OutboxCountParkedSQL, "{{table}}", ""))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.String(), "outbox_pending_blocked_idx") || strings.Contains(plan.String(), "Seq Scan") {
		t.Errorf("the count of parked rows does not read outbox_pending_blocked_idx:\n%s", plan.String())
	}
	count := func(want int) {
		t.Helper()
		if n, err := drv.Executor().OutboxCountParked(ctx); err != nil || n != want {
			t.Fatalf("OutboxCountParked = %d, %v; want %d", n, err, want)
		}
	}
	count(3)
	if _, err := pool.Exec(ctx, `UPDATE outbox_pending SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
		WHERE id = (SELECT id FROM outbox WHERE event_id = $1)`, poison[1].ID); err != nil {
		t.Fatal(err)
	}
	count(2)
	// OutboxUnpark reads the same index, whether it selects by event ID,
	// by key or every parked row.
	for _, args := range [][]any{
		{nil, nil, nil, 1000},
		{time.Now(), nil, []string{"p1"}, 1000},
		{nil, []uuid.UUID{poison[0].ID}, nil, 1},
	} {
		plan := explain(t, pool, pgsql.OutboxUnparkSQL, args...)
		if !strings.Contains(plan, "outbox_pending_blocked_idx") || strings.Contains(plan, "Seq Scan on outbox_pending") {
			t.Errorf("the unpark of %v does not read outbox_pending_blocked_idx:\n%s", args, plan)
		}
	}
	// So does OutboxRetryNow (next_attempt_at > $1 implies its predicate).
	if plan := explain(t, pool, pgsql.OutboxRetryNowSQL, time.Now(), 1000); !strings.Contains(plan, "outbox_pending_blocked_idx") || strings.Contains(plan, "Seq Scan on outbox_pending") {
		t.Errorf("OutboxRetryNow does not read outbox_pending_blocked_idx:\n%s", plan)
	}
	if n, err := drv.Executor().OutboxUnpark(ctx, &driver.OutboxUnparkParams{EventIDs: []uuid.UUID{poison[0].ID}, Limit: 1}); err != nil || n != 1 {
		t.Fatalf("OutboxUnpark = %d, %v; want 1", n, err)
	}
	count(1)
	rec := &recorder{}
	drain(t, newRelay(t, drv, rec, nil))
	for _, e := range poison[:2] {
		if !slices.ContainsFunc(rec.published(), func(p event.Envelope) bool { return p.ID == e.ID }) {
			t.Errorf("the unparked event %s was not published", e.ID)
		}
	}
	count(1)
}

// explain returns the plan of query (its {{table}} placeholders removed)
// with args.
func explain(t *testing.T, pool *pgxpool.Pool, query string, args ...any) string {
	t.Helper()
	var plan strings.Builder
	rows, err := pool.Query(t.Context(), `EXPLAIN `+strings.ReplaceAll(query, "{{table}}", ""), args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan.String()
}

// A batch of Redrive or of Unpark reads about as many rows as it changes,
// however many it changed before: each batch used to read every published
// event, or step over every event unparked before it (redriving 200,000
// events took 25 s, unparking them 19 s: 0.1 s a batch).
func TestOutboxRedriveAndUnparkBatchesReadTheirRows(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	pool := drv.Pool()
	ex := drv.Executor()
	const n = 20000
	for _, q := range []string{
		`INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
			SELECT gen_random_uuid(), 'Test.Happened.v1', 'k' || (g % 200), '\x7b7d', now(), now()
			FROM generate_series(1, 20000) g`,
		// Half of them published by a relay, in ID order; the others parked.
		`WITH d AS (DELETE FROM outbox_pending WHERE id % 2 = 0 RETURNING id)
			INSERT INTO outbox_published (id, published_at) SELECT id, now() - interval '1 hour' + id * interval '1 ms' FROM d`,
		`UPDATE outbox_pending SET parked_at = now() - interval '1 hour' + id * interval '1 ms', attempts = 5, last_error = 'poison'`,
		`ANALYZE outbox_published`,
		`ANALYZE outbox_pending`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Half of each done, as a loop of batches leaves them.
	end := time.Now().Add(time.Hour)
	if got, err := ex.OutboxRedrive(ctx, &driver.OutboxRedriveParams{PublishedBefore: end, Limit: n / 4}); err != nil || got != n/4 {
		t.Fatalf("OutboxRedrive = %d, %v; want %d", got, err, n/4)
	}
	if got, err := ex.OutboxUnpark(ctx, &driver.OutboxUnparkParams{ParkedBefore: end, Limit: n / 4}); err != nil || got != n/4 {
		t.Fatalf("OutboxUnpark = %d, %v; want %d", got, err, n/4)
	}
	const limit = 100
	for _, c := range []struct {
		what, sql string
		args      []any
	}{
		{"redrive", pgsql.OutboxRedriveSQL, []any{time.Time{}, end, nil, limit}},
		{"unpark", pgsql.OutboxUnparkSQL, []any{end, nil, nil, limit}},
	} {
		if read, plan := rowsRead(t, pool, c.sql, c.args...); read > 4*limit {
			t.Errorf("the next batch of %d of the %s reads %d rows:\n%s", limit, c.what, read, plan)
		}
	}
	// And the loops change every row left once.
	if got, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{BatchSize: 300}); err != nil || got != n/4 {
		t.Errorf("Redrive = %d, %v; want %d", got, err, n/4)
	}
	if got, err := outbox.Unpark(ctx, drv, outbox.UnparkOptions{All: true, BatchSize: 300}); err != nil || got != n/4 {
		t.Errorf("Unpark = %d, %v; want %d", got, err, n/4)
	}
}

// rowsRead runs query (its {{table}} placeholders removed) with args under
// EXPLAIN ANALYZE in a transaction it rolls back, and returns how many rows
// its scans read (returned or filtered out), and the plan.
func rowsRead(t *testing.T, pool *pgxpool.Pool, query string, args ...any) (int, string) {
	t.Helper()
	ctx := t.Context()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var out []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+strings.ReplaceAll(query, "{{table}}", ""), args...).Scan(&out); err != nil {
		t.Fatal(err)
	}
	read := 0
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		num := func(k string) int { f, _ := node[k].(float64); return int(f) }
		if typ, _ := node["Node Type"].(string); strings.HasSuffix(typ, "Scan") && typ != "CTE Scan" {
			read += (num("Actual Rows") + num("Rows Removed by Filter")) * max(num("Actual Loops"), 1)
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			if m, ok := c.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(out[0].Plan)
	plan, _ := json.MarshalIndent(out[0].Plan, "", "  ")
	return read, string(plan)
}

// The listener's connection runs the pool's BeforeConnect, as the pool's
// own connections do: a pool whose credentials come from it (an RDS IAM
// token, a rotated password) must not leave the listener connecting
// without them. Here the pool's URL names a role that does not exist and
// BeforeConnect puts the real one in.
func TestListenOutboxRunsThePoolsBeforeConnect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, schema := testdb.Schema(t, 1)
	cfg, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	user := cfg.ConnConfig.User
	cfg.ConnConfig.User = "idem_no_such_role"
	cfg.BeforeConnect = func(_ context.Context, c *pgx.ConnConfig) error {
		c.User = user
		return nil
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	drv := newDriver(t, pool, &pgdriver.Config{Schema: schema})
	wake, err := drv.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatalf("ListenOutbox on a pool whose BeforeConnect sets the role: %v", err)
	}
	select { // the signal of the first connection, if any
	case <-wake:
	default:
	}
	enqueue(t, drv, newEvent(t, "k", 1))
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Error("the listener was not woken by an enqueue")
	}
}

// The listener's connection stops answering without being closed (a
// network partition, a failover behind a load balancer or NAT, a firewall
// that lost its state: no error, no notification ever again): the
// listener finds it out by its check, reports it, connects again and
// wakes the relay for the commits made from then on. Before the check it
// waited on the dead connection for as long as TCP keepalives take (for
// ever behind this proxy, which acknowledges), reporting nothing, every
// wake-up lost.
func TestOutboxListenerLeavesABlackHoledConnection(t *testing.T) {
	defer pgsql.SetListenCheck(500*time.Millisecond, 500*time.Millisecond)()
	pool, schema := testdb.Schema(t, 2)
	proxy := testdb.NewProxy(t)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema, ListenConnConfig: proxy.ConnConfig(t, schema)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 10)
	wake, err := drv.ListenOutbox(ctx, func(err error) { errs <- err })
	if err != nil {
		t.Fatalf("ListenOutbox: %v", err)
	}
	if n := len(proxy.BlackHoleAll()); n != 1 {
		t.Fatalf("black-holed %d connections; want the listener's", n)
	}
	cut := time.Now()
	select {
	case err := <-errs:
		t.Logf("listener reported %s after the fault: %v", time.Since(cut).Round(time.Millisecond), err)
	case <-time.After(20 * time.Second):
		t.Fatal("the listener did not report its black-holed connection within 20 s")
	}
	for reported := true; reported; {
		select {
		case err := <-errs:
			reported = err != nil
		case <-time.After(20 * time.Second):
			t.Fatal("the listener did not connect again (onError(nil))")
		}
	}
	for len(wake) > 0 {
		<-wake
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		enqueue(t, drv, newEvent(t, "k", int(time.Now().UnixNano())))
		select {
		case <-wake:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no wake-up for commits after the listener connected again")
		}
	}
}

// ListenOutbox whose connection the network black-holes while it is made
// (its LISTEN never answered, nothing closed) fails within its bound, and
// the relay calling it tries again; before, it waited as long as TCP does
// (for ever behind this proxy, which acknowledges), and the relay's
// wake-ups never started.
func TestListenOutboxGivesUpABlackHoledConnection(t *testing.T) {
	defer pgsql.SetListenConnectTimeout(time.Second)()
	pool, schema := testdb.Schema(t, 2)
	proxy := testdb.NewProxy(t)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema, ListenConnConfig: proxy.ConnConfig(t, schema)})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	f := proxy.Arm(testdb.BlackHole, func(b []byte) bool { return strings.Contains(string(b), "LISTEN ") })
	t.Cleanup(f.Cut)
	done := make(chan error, 1)
	started := time.Now()
	go func() {
		_, err := drv.ListenOutbox(t.Context(), nil)
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("ListenOutbox returned %s after it started: %v", time.Since(started).Round(time.Millisecond), err)
		if err == nil {
			t.Fatal("ListenOutbox succeeded on a black-holed connection")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("ListenOutbox still waited on its black-holed LISTEN after 15 s (bound 1s)")
	}
	if _, err := drv.ListenOutbox(t.Context(), nil); err != nil {
		t.Fatalf("ListenOutbox on a new connection: %v", err)
	}
}

// A claim's read skips the keys that are backing off or parked by probing
// outbox_pending_blocked_idx by key for each pending row it reads. The
// statistics of outbox_pending are those of its last ANALYZE, almost
// always taken when nothing failed: the planner then expects one blocked
// row and read the whole blocked index once (Materialize) to compare every
// pending row with every blocked row (a join filter). When a broker
// partition stops answering, the heads of its keys back off: with 1,624
// blocked keys and 2 million pending rows a claim took 175 ms instead of
// 35 ms, and with every key blocked (a broker outage, 10,000 keys) one
// claim ran for over ten minutes instead of 7.7 s. Here the statistics
// are taken with nothing blocked, then the heads of half the keys back
// off.
func TestOutboxReadProbesBlockedKeysWithStaleStatistics(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	pool := drv.Pool()
	for _, q := range []string{
		`INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
			SELECT gen_random_uuid(), 'Test.Happened.v1', 'k' || (g % 2000), '\x7b7d', now(), now()
			FROM generate_series(1, 20000) g`,
		`ANALYZE outbox_pending`,
		`UPDATE outbox_pending SET attempts = 1, last_error = 'broker down', next_attempt_at = now() + interval '1 hour'
			WHERE id IN (SELECT min(id) FROM outbox_pending WHERE record_key < 'k5' GROUP BY record_key)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	lanes := make([]int16, pgdriver.OutboxLanes)
	for i := range lanes {
		lanes[i] = int16(i)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, pgsql.OutboxBitmapOffSQL); err != nil { // as the claim reads
		t.Fatal(err)
	}
	var out []struct {
		Plan map[string]any `json:"Plan"`
	}
	read := strings.ReplaceAll(pgsql.OutboxReadSQL, "{{table}}", "")
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+read, lanes, time.Now(), 500).Scan(&out); err != nil {
		t.Fatal(err)
	}
	compared := 0
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		num := func(k string) int { f, _ := node[k].(float64); return int(f) }
		compared += num("Rows Removed by Join Filter") * max(num("Actual Loops"), 1)
		if name, _ := node["Index Name"].(string); strings.HasSuffix(name, "outbox_pending_blocked_idx") {
			if cond, _ := node["Index Cond"].(string); !strings.Contains(cond, "record_key") {
				plan, _ := json.MarshalIndent(out[0].Plan, "", "  ")
				t.Errorf("the read scans outbox_pending_blocked_idx without the key (Index Cond %q): every pending row read is compared with every blocked row:\n%s", cond, plan)
			}
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			if m, ok := c.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(out[0].Plan)
	if compared > 1000 {
		t.Errorf("the read compared %d pairs of pending and blocked rows to read 500 rows; want each pending row probed by its key", compared)
	}
}

// With Config.NoOutboxNotify an enqueue commits without pg_notify (a
// notifying COMMIT is serialised server-wide, see the field), and the
// driver's ListenOutbox says there is nothing to listen for; a driver on
// the same tables without it still notifies its relays.
func TestOutboxNoNotify(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 10)
	notifying, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := notifying.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	silent, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema, NoOutboxNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := silent.ListenOutbox(t.Context(), nil); !errors.Is(err, driver.ErrOutboxNotifyOff) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("ListenOutbox with NoOutboxNotify: %v; want driver.ErrOutboxNotifyOff (errors.ErrUnsupported)", err)
	}
	wake, err := notifying.ListenOutbox(t.Context(), nil)
	if err != nil {
		t.Fatalf("ListenOutbox: %v", err)
	}
	if silent.OutboxChannel() != notifying.OutboxChannel() {
		t.Fatalf("channels differ: %q and %q", silent.OutboxChannel(), notifying.OutboxChannel())
	}
	// Once the listener is in place (its first wake-up), the silent
	// driver's committed enqueue wakes nothing, and the notifying one's
	// does.
	enqueue(t, notifying, newEvent(t, "k", 1))
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Fatal("no wake-up for the notifying driver's enqueue within 30s")
	}
	enqueue(t, silent, newEvent(t, "k", 2))
	select {
	case <-wake:
		t.Fatal("the NoOutboxNotify driver's enqueue woke the listener")
	case <-time.After(time.Second):
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{schema, "outbox"}.Sanitize()).Scan(&n); err != nil || n != 2 {
		t.Fatalf("outbox rows = %d, %v; want 2", n, err)
	}
	enqueue(t, notifying, newEvent(t, "k", 3))
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Fatal("no wake-up for the notifying driver's second enqueue within 30s")
	}
}
