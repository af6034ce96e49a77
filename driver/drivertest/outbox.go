package drivertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// runOutbox runs the outbox suite against the backend that newDriver builds:
// the OutboxExecutor semantics (dedup by event ID, claim order, per-key
// blocking by a backing-off or parked head, marks, cleanup, lag) and the
// behaviour of outbox.EnqueueTx and outbox.Relay on that backend with an
// in-memory publisher: committed events are published once, rolled-back ones
// never, each key's events in order under random publish failures, a failing
// or poison key does not block the others, a crash between publish and mark
// republishes the same IDs, and (on backends with concurrent writers) several
// relays in parallel publish every event exactly once.
//
// newDriver must return a fresh, migrated driver on its own database, as for
// Run.
func runOutbox[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx])
	}{
		{"Insert/RoundTrip", testOutboxRoundTrip[TTx]},
		{"Insert/DuplicateEventIDIsNoOp", testOutboxDuplicateInsert[TTx]},
		{"Claim/HeadsBlockTheirKeyOnly", testOutboxClaimHeads[TTx]},
		{"Claim/Limit", testOutboxClaimLimit[TTx]},
		{"Claim/MaxBytes", testOutboxClaimMaxBytes[TTx]},
		{"Mark/FailedAndPark", testOutboxMarkFailedAndPark[TTx]},
		{"Claim/FindsTheOneClaimableKey", testOutboxClaimOneClaimable[TTx]},
		{"DeletePublishedBefore", testOutboxDeletePublished[TTx]},
		{"OldestUnpublished", testOutboxOldestUnpublished[TTx]},
		{"CountParked", testOutboxCountParked[TTx]},
		{"Redrive", testOutboxRedrive[TTx]},
		{"Unpark", testOutboxUnpark[TTx]},
		{"RetryNow", testOutboxRetryNow[TTx]},
		{"Relay/CommittedEnqueuePublishedOnce", testRelayCommitted[TTx]},
		{"Relay/RolledBackEnqueueNeverPublished", testRelayRolledBack[TTx]},
		{"Relay/DuplicateEnqueuePublishedOnce", testRelayDuplicateEnqueue[TTx]},
		{"Relay/EnqueueRejectsInvalidEnvelope", testRelayEnqueueInvalid[TTx]},
		{"Relay/PerKeyOrderWithRandomFailures", testRelayOrderWithFailures[TTx]},
		{"Relay/FailingKeyDoesNotBlockOthers", testRelayFailingKey[TTx]},
		{"Relay/PerEventResults", testRelayPerEventResults[TTx]},
		{"Relay/PoisonParksOnlyItsKey", testRelayPoison[TTx]},
		{"Relay/CrashBetweenPublishAndMark", testRelayMarkFails[TTx]},
		{"Relay/PublisherPanicReleasesClaim", testRelayPublisherPanics[TTx]},
		{"Relay/ConcurrentRelaysExactlyOnce", testRelayConcurrent[TTx]},
		{"Relay/Run", testRelayRun[TTx]},
		{"Relay/RedriveRepublishesSameEvents", testRelayRedrive[TTx]},
		{"Relay/UnparkPublishesTheKeyInOrder", testRelayUnpark[TTx]},
	}
	t.Run("Outbox", func(t *testing.T) {
		t.Parallel()
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				tt.fn(t, newDriver)
			})
		}
	})
}

// ---- helpers ---------------------------------------------------------------

// obEnvelope returns a valid envelope of key whose payload carries seq.
func obEnvelope(t *testing.T, key string, seq int) event.Envelope {
	t.Helper()
	e, err := event.New("Test.Happened.v1", key, map[string]int{"seq": seq})
	if err != nil {
		t.Fatalf("event.New: %v", err)
	}
	return e
}

// obRow returns a row of key created at created.
func obRow(t *testing.T, key string, seq int, created time.Time) driver.OutboxRow {
	t.Helper()
	e := obEnvelope(t, key, seq)
	return driver.OutboxRow{
		EventID: e.ID, EventType: e.Type, Key: e.Key, OccurredAt: e.OccurredAt,
		Payload: e.Payload, CreatedAt: created,
	}
}

func obInsert(t *testing.T, ex driver.Executor, rows ...driver.OutboxRow) int {
	t.Helper()
	n, err := ex.OutboxInsert(t.Context(), rows)
	if err != nil {
		t.Fatalf("OutboxInsert(%d rows): %v", len(rows), err)
	}
	return n
}

// obClaim claims in a transaction that it rolls back, so the result only
// shows what would be claimed.
func obClaim[TTx any](t *testing.T, drv driver.Driver[TTx], now time.Time, limit int) []driver.OutboxRow {
	t.Helper()
	tx := begin(t, drv)
	defer rollback(t, drv, tx)
	rows, err := drv.UnwrapExecutor(tx).OutboxClaimBatch(t.Context(), &driver.OutboxClaimBatchParams{Now: now, Limit: limit})
	if err != nil {
		t.Fatalf("OutboxClaimBatch(%s, %d): %v", now, limit, err)
	}
	return rows
}

// obIDs returns the event IDs of rows.
func obIDs(rows []driver.OutboxRow) []uuid.UUID {
	out := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		out[i] = r.EventID
	}
	return out
}

// obRowIDs returns the row IDs of rows.
func obRowIDs(rows ...driver.OutboxRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// obStored inserts rows one by one and returns them as claimed, with their
// row IDs, in insert order (every row of a distinct key is a head).
func obStored[TTx any](t *testing.T, drv driver.Driver[TTx], rows ...driver.OutboxRow) []driver.OutboxRow {
	t.Helper()
	obInsert(t, drv.Executor(), rows...)
	claimed := obClaim(t, drv, t0.Add(time.Hour), 1000)
	byID := map[uuid.UUID]driver.OutboxRow{}
	for _, r := range claimed {
		byID[r.EventID] = r
	}
	out := make([]driver.OutboxRow, len(rows))
	for i, r := range rows {
		c, ok := byID[r.EventID]
		if !ok {
			t.Fatalf("row %d (%s, key %q) not claimable after insert", i, r.EventID, r.Key)
		}
		out[i] = c
	}
	return out
}

func obWantIDs(t *testing.T, what string, got []driver.OutboxRow, want ...driver.OutboxRow) {
	t.Helper()
	if g, w := obIDs(got), obIDs(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s: claimed %s; want %s", what, obFmt(got), obFmt(want))
	}
}

func obFmt(rows []driver.OutboxRow) string {
	s := "["
	for i, r := range rows {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s#%d", r.Key, r.ID)
	}
	return s + "]"
}

// obPublisher is the in-memory Publisher of the relay tests. It records
// every event it publishes, in order, duplicates included. fail, if set,
// decides for each call which events are published (ok[i]; nil: all) and
// which error is returned.
type obPublisher struct {
	mu    sync.Mutex
	got   []event.Envelope
	calls int
	// unacked: events published by a call whose error did not report them
	// published (the relay may publish them again).
	unacked map[uuid.UUID]bool
	fail    func(call int, events []event.Envelope) (ok []bool, err error)
	delay   time.Duration
}

// obPrefix returns ok for the first n of total events.
func obPrefix(total, n int) []bool {
	ok := make([]bool, total)
	for i := range n {
		ok[i] = true
	}
	return ok
}

var errBroker = errors.New("broker unavailable")

func (p *obPublisher) Publish(ctx context.Context, events []event.Envelope) error {
	if p.delay > 0 {
		time.Sleep(p.delay)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	var (
		ok  []bool
		err error
	)
	if p.fail != nil {
		ok, err = p.fail(p.calls, events)
	}
	var pe *outbox.PublishError
	reported := errors.As(err, &pe) && len(pe.Errs) == len(events)
	for i, e := range events {
		if ok != nil && !ok[i] {
			continue
		}
		p.got = append(p.got, e)
		if err != nil && (!reported || pe.Errs[i] != nil) {
			if p.unacked == nil {
				p.unacked = map[uuid.UUID]bool{}
			}
			p.unacked[e.ID] = true
		}
	}
	return err
}

func (p *obPublisher) published() []event.Envelope {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]event.Envelope(nil), p.got...)
}

func (p *obPublisher) callCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// failAtKey returns a fail function that fails at the first event of key.
func failAtKey(key string) func(int, []event.Envelope) ([]bool, error) {
	return func(_ int, events []event.Envelope) ([]bool, error) {
		for i, e := range events {
			if e.Key == key {
				return obPrefix(len(events), i), outbox.PrefixError(len(events), i, fmt.Errorf("rejected %s: %w", key, errBroker))
			}
		}
		return nil, nil
	}
}

// obEnqueue enqueues events in one transaction and commits it.
func obEnqueue[TTx any](t testing.TB, drv driver.Driver[TTx], events ...event.Envelope) {
	t.Helper()
	ctx := context.Background()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Errorf("Begin: %v", err)
		return
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, events...); err != nil {
		_ = drv.Rollback(ctx, tx)
		t.Errorf("EnqueueTx: %v", err)
		return
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Errorf("Commit: %v", err)
	}
}

func obRelay[TTx any](t *testing.T, drv driver.Driver[TTx], pub outbox.Publisher, cfg *outbox.RelayConfig) *outbox.Relay[TTx] {
	t.Helper()
	r, err := outbox.NewRelay(drv, pub, cfg)
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	return r
}

// obPending reports whether unpublished rows remain. It may be called from
// any goroutine: an error fails the test and reports false.
func obPending[TTx any](t *testing.T, drv driver.Driver[TTx]) bool {
	t.Helper()
	_, ok, err := drv.Executor().OutboxOldestUnpublished(t.Context())
	if err != nil {
		t.Errorf("OutboxOldestUnpublished: %v", err)
		return false
	}
	return ok
}

// obQuietLogger discards the relay's logs in tests that fail on purpose.
func obQuietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// obDrain runs the relay until nothing is unpublished (and done, if not nil,
// is closed), tolerating publish failures, for at most 20s.
func obDrain[TTx any](t *testing.T, drv driver.Driver[TTx], relay *outbox.Relay[TTx], done <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := relay.RunOnce(t.Context())
		var pe *outbox.PublishError
		if err != nil && !errors.Is(err, errBroker) && !errors.As(err, &pe) {
			t.Fatalf("RunOnce: %v", err)
		}
		finished := true
		if done != nil {
			select {
			case <-done:
			default:
				finished = false
			}
		}
		if finished && n == 0 && err == nil && !obPending(t, drv) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("outbox not drained after 20s")
		}
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// obCheckOrder checks what a consumer received against want, the events of
// each key in enqueue order: every event arrived; an event never arrived
// before all the earlier events of its key had arrived; an event arrived
// twice only if exactly is false and the publisher had published it in a
// call that failed (a republication of the same ID, never a new ID).
func obCheckOrder(t *testing.T, got []event.Envelope, want map[string][]uuid.UUID, unacked map[uuid.UUID]bool, exactly bool) {
	t.Helper()
	pos := map[uuid.UUID]int{}
	for _, ids := range want {
		for i, id := range ids {
			pos[id] = i
		}
	}
	next := map[string]int{}
	errs := 0
	bad := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		if errs++; errs >= 10 {
			t.Fatal("too many errors")
		}
	}
	for _, e := range got {
		i, ok := pos[e.ID]
		switch {
		case !ok:
			bad("published an unknown event %s (key %q)", e.ID, e.Key)
		case i == next[e.Key]:
			next[e.Key]++
		case i > next[e.Key]:
			bad("key %q: event #%d (%s) published before event #%d: per-key order broken", e.Key, i, e.ID, next[e.Key])
		case exactly:
			bad("key %q: event #%d (%s) published twice", e.Key, i, e.ID)
		case !unacked[e.ID]:
			bad("key %q: event #%d (%s) published again although its first publication was acknowledged", e.Key, i, e.ID)
		}
	}
	for key, ids := range want {
		if next[key] != len(ids) {
			t.Errorf("key %q: %d of %d events published", key, next[key], len(ids))
		}
	}
}

// ---- executor semantics ----------------------------------------------------

// Every field of a row survives the round trip: bytes byte for byte, times
// to the microsecond as the same instant, headers as the same JSON object,
// an empty saga ID as empty.
func testOutboxRoundTrip[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	full := obRow(t, "order-1", 1, t0)
	full.SagaID = "saga-7"
	full.Payload = []byte(`{"amount":"10.5000","note":"\u00e9\u0000"}`)
	full.Headers = []byte(`{"traceparent":"00-abc-01","Tenant":"t1"}`)
	full.OccurredAt = t0.Add(-time.Second)
	bare := obRow(t, "order-2", 1, t0.Add(time.Microsecond))

	if n := obInsert(t, drv.Executor(), full, bare); n != 2 {
		t.Fatalf("OutboxInsert of 2 new rows = %d", n)
	}
	got := obClaim(t, drv, t0, 10)
	if len(got) != 2 {
		t.Fatalf("claimed %s; want both rows", obFmt(got))
	}
	if got[0].ID >= got[1].ID {
		t.Errorf("row IDs %d, %d do not follow the insert order", got[0].ID, got[1].ID)
	}
	for i, want := range []driver.OutboxRow{full, bare} {
		g := got[i]
		if g.EventID != want.EventID || g.EventType != want.EventType || g.Key != want.Key || g.SagaID != want.SagaID {
			t.Errorf("row %d: id/type/key/saga = %s %q %q %q; want %s %q %q %q", i,
				g.EventID, g.EventType, g.Key, g.SagaID, want.EventID, want.EventType, want.Key, want.SagaID)
		}
		if string(g.Payload) != string(want.Payload) {
			t.Errorf("row %d: payload %q; want %q", i, g.Payload, want.Payload)
		}
		if !g.OccurredAt.Equal(want.OccurredAt) || !g.CreatedAt.Equal(want.CreatedAt) {
			t.Errorf("row %d: occurred %s created %s; want %s, %s", i, g.OccurredAt, g.CreatedAt, want.OccurredAt, want.CreatedAt)
		}
		if g.Attempts != 0 || g.LastError != "" || !g.NextAttemptAt.IsZero() || !g.ParkedAt.IsZero() || !g.PublishedAt.IsZero() {
			t.Errorf("row %d: delivery state %+v; want a fresh row", i, g)
		}
	}
	var h map[string]string
	if err := json.Unmarshal(got[0].Headers, &h); err != nil || !reflect.DeepEqual(h, map[string]string{"traceparent": "00-abc-01", "Tenant": "t1"}) {
		t.Errorf("headers %q (%v); want the stored object", got[0].Headers, err)
	}
	if got[1].Headers != nil {
		t.Errorf("headers of a row without headers = %q; want nil", got[1].Headers)
	}
}

// The same event ID enqueued again (in the same batch or later) is one row.
func testOutboxDuplicateInsert[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ex := drv.Executor()
	a := obRow(t, "k", 1, t0)
	retry := a
	retry.Payload = []byte(`{"seq":"a retry must not become a second event"}`)
	b := obRow(t, "k", 2, t0)
	if n := obInsert(t, ex, a, retry); n != 1 {
		t.Errorf("inserting an event and its duplicate in one batch = %d new; want 1", n)
	}
	if n := obInsert(t, ex, a); n != 0 {
		t.Errorf("inserting a stored event again = %d new; want 0", n)
	}
	if n := obInsert(t, ex, b, retry); n != 1 {
		t.Errorf("inserting a new event and a stored one = %d new; want 1", n)
	}
	if n, err := ex.OutboxInsert(t.Context(), nil); n != 0 || err != nil {
		t.Errorf("OutboxInsert(nil) = %d, %v; want 0, nil", n, err)
	}
	got := obClaim(t, drv, t0, 10)
	obWantIDs(t, "after duplicate inserts", got, a, b)
	if len(got) > 0 && string(got[0].Payload) != string(a.Payload) {
		t.Errorf("stored payload %s; want the first version %s", got[0].Payload, a.Payload)
	}
}

// A key is claimable only through its head: a head backing off or parked
// blocks its key (and only its key); a due head brings the following due
// rows of its key, up to the first one that is not due.
func testOutboxClaimHeads[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	now := t0
	rows := obStored(t, drv,
		obRow(t, "A", 1, now), obRow(t, "B", 1, now), obRow(t, "A", 2, now), obRow(t, "C", 1, now),
		obRow(t, "D", 1, now), obRow(t, "B", 2, now), obRow(t, "A", 3, now), obRow(t, "D", 2, now))
	a1, b1, a2, c1, d1, b2, a3, d2 := rows[0], rows[1], rows[2], rows[3], rows[4], rows[5], rows[6], rows[7]

	obWantIDs(t, "all due", obClaim(t, drv, now, 100), a1, b1, a2, c1, d1, b2, a3, d2)

	later := now.Add(time.Hour)
	if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: b1.ID, Error: "boom", NextAttempt: later}); err != nil { // B's head backs off
		t.Fatalf("MarkFailed: %v", err)
	}
	if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: a2.ID, Error: "boom", NextAttempt: later}); err != nil { // A's second row backs off
		t.Fatalf("MarkFailed: %v", err)
	}
	if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: c1.ID, Error: "poison", At: now}); err != nil { // C's head is parked
		t.Fatalf("Park: %v", err)
	}
	obWantIDs(t, "B's head backing off, A's second row backing off, C parked", obClaim(t, drv, now, 100), a1, d1, d2)
	obWantIDs(t, "an hour later", obClaim(t, drv, later, 100), a1, b1, a2, d1, b2, a3, d2)

	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(a1, d1), At: now}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	obWantIDs(t, "A's new head backing off", obClaim(t, drv, now, 100), d2)
	obWantIDs(t, "an hour later", obClaim(t, drv, later, 100), b1, a2, b2, a3, d2)

	// A key enqueued behind a parked head stays blocked.
	obInsert(t, ex, obRow(t, "C", 2, now))
	for _, r := range obClaim(t, drv, later, 100) {
		if r.Key == "C" {
			t.Errorf("claimed %s#%d behind a parked head", r.Key, r.ID)
		}
	}
}

// limit bounds the batch. Which keys a limited claim takes is the
// backend's choice (the lowest IDs on SQLite, the keys of the lanes it locks
// on PostgreSQL), but the rows of each key are always the first ones of its
// queue, in ID order, and a claim whose limit covers every claimable row
// returns them all.
func testOutboxClaimLimit[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	for _, shape := range []struct {
		name string
		keys []string
	}{
		{"one key then another", []string{"A", "A", "B", "A"}},
		{"interleaved", []string{"A", "B", "A", "C", "A", "B"}},
	} {
		drv := newDriver(t)
		var in []driver.OutboxRow
		for i, k := range shape.keys {
			in = append(in, obRow(t, k, i, t0))
		}
		rows := obStored(t, drv, in...)
		for limit := 1; limit <= len(rows)+1; limit++ {
			got := obClaim(t, drv, t0, limit)
			if len(got) == 0 || len(got) > limit {
				t.Errorf("%s, limit %d: claimed %d rows; want 1 to %d", shape.name, limit, len(got), limit)
			}
			if limit >= len(rows) {
				obWantIDs(t, fmt.Sprintf("%s, limit %d", shape.name, limit), got, rows...)
				continue
			}
			// Each key's rows are a prefix of its queue, in ID order.
			next := map[string]int{}
			var prev int64
			for _, r := range got {
				if r.ID <= prev {
					t.Errorf("%s, limit %d: IDs not increasing: %v", shape.name, limit, obRowIDs(got...))
				}
				prev = r.ID
				var queue []driver.OutboxRow
				for _, q := range rows {
					if q.Key == r.Key {
						queue = append(queue, q)
					}
				}
				if i := next[r.Key]; i >= len(queue) || queue[i].ID != r.ID {
					t.Errorf("%s, limit %d: claimed %v; the rows of key %s are not the first of its queue", shape.name, limit, obRowIDs(got...), r.Key)
				}
				next[r.Key]++
			}
		}
	}
	drv := newDriver(t)
	tx := begin(t, drv)
	if _, err := drv.UnwrapExecutor(tx).OutboxClaimBatch(t.Context(), &driver.OutboxClaimBatchParams{Now: t0, Limit: 0}); err == nil {
		t.Error("OutboxClaimBatch with limit 0 succeeded; want an error")
	}
}

func testOutboxMarkFailedAndPark[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	rows := obStored(t, drv, obRow(t, "A", 1, t0), obRow(t, "B", 1, t0))
	a, b := rows[0], rows[1]

	retry := t0.Add(time.Minute)
	if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: a.ID, Error: "first", NextAttempt: t0.Add(time.Second)}); err != nil {
		t.Fatalf("MarkFailed: %v", err)
	}
	if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: a.ID, Error: "second", NextAttempt: retry}); err != nil {
		t.Fatalf("MarkFailed: %v", err)
	}
	got := obClaim(t, drv, retry, 10)
	if len(got) != 2 || got[0].Attempts != 2 || got[0].LastError != "second" || !got[0].NextAttemptAt.Equal(retry) {
		t.Errorf("after two failures: %+v; want attempts 2, last error \"second\", next attempt %s", got, retry)
	}
	if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: a.ID, Error: "gave up", At: retry}); err != nil {
		t.Fatalf("Park: %v", err)
	}
	obWantIDs(t, "after parking A", obClaim(t, drv, retry.Add(time.Hour), 10), b)

	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(b), At: t0}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	for name, err := range map[string]error{
		"MarkFailed of a published row": ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: b.ID, Error: "x", NextAttempt: t0}),
		"Park of a published row":       ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: b.ID, Error: "x", At: t0}),
		"MarkFailed of an unknown row":  ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: b.ID + 1000, Error: "x", NextAttempt: t0}),
		"Park of an unknown row":        ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: b.ID + 1000, Error: "x", At: t0}),
	} {
		if !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("%s: %v; want driver.ErrNotFound", name, err)
		}
	}
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: nil, At: t0}); err != nil {
		t.Errorf("MarkPublished(nil): %v", err)
	}
}

// MaxBytes cuts the claim short of the rows whose payloads would pass it,
// and never below one row: each key keeps a prefix of its queue, and an
// event larger than the bound is claimed alone. Each bound is claimed twice
// (PostgreSQL's drivers cut in Go or in the statement, depending on the
// payloads the previous claim read); on SQLite, which reads in ID order,
// the rows kept are the longest run of the first rows that fits.
func testOutboxClaimMaxBytes[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	sizes := []int{100, 300, 50, 1000, 20, 200, 200, 5000, 10}
	keys := []string{"A", "B", "A", "C", "B", "A", "D", "C", "A"}
	var in []driver.OutboxRow
	total := 0
	for i, k := range keys {
		r := obRow(t, k, i, t0)
		r.Payload = []byte(`"` + strings.Repeat("x", sizes[i]-2) + `"`)
		in = append(in, r)
		total += sizes[i]
	}
	rows := obStored(t, drv, in...)
	inIDOrder := !drv.Caps().ConcurrentWriters
	for _, bound := range []int{0, 1 << 30, 1, 99, 100, 399, 400, 450, 1450, 1470, 1670, 1870, 6869, 6870, 6880, 1 << 30, 0} {
		for range 2 {
			tx := begin(t, drv)
			got, err := drv.UnwrapExecutor(tx).OutboxClaimBatch(t.Context(), &driver.OutboxClaimBatchParams{Now: t0, Limit: 100, MaxBytes: bound})
			rollback(t, drv, tx)
			if err != nil {
				t.Fatalf("OutboxClaimBatch(MaxBytes %d): %v", bound, err)
			}
			what := fmt.Sprintf("MaxBytes %d", bound)
			if bound == 0 || bound >= total {
				obWantIDs(t, what, got, rows...)
				continue
			}
			sum := 0
			for _, r := range got {
				sum += len(r.Payload)
			}
			if len(got) == 0 || sum > bound && len(got) > 1 {
				t.Errorf("%s: claimed %s, %d bytes of payloads; want at least one row, and more only within the bound", what, obFmt(got), sum)
			}
			next := map[string]int{}
			for _, r := range got {
				var queue []driver.OutboxRow
				for _, q := range rows {
					if q.Key == r.Key {
						queue = append(queue, q)
					}
				}
				if i := next[r.Key]; i >= len(queue) || queue[i].ID != r.ID {
					t.Errorf("%s: claimed %s; the rows of key %s are not the first of its queue", what, obFmt(got), r.Key)
				}
				next[r.Key]++
			}
			if inIDOrder {
				want, sum := rows, 0
				for i, r := range rows {
					if sum += len(r.Payload); sum > bound && i > 0 {
						want = rows[:i]
						break
					}
				}
				obWantIDs(t, what, got, want...)
			}
		}
	}
}

// With the rows of every key but one backing off (a broker partition down,
// say), every claim returns the one claimable row, whatever its key's lane
// and whatever the claim's limit: a claim that finds only blocked keys in
// the lanes it took tries the others.
func testOutboxClaimOneClaimable[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	var rows []driver.OutboxRow
	for i := range 200 { // enough keys to fill every lane
		rows = append(rows, obRow(t, fmt.Sprintf("key-%d", i), 1, t0))
	}
	obInsert(t, ex, rows...)
	const freeKey = "key-137"
	// Every other row fails and backs off for an hour, as the relay marks
	// them: claim (a claim takes some lanes), mark, until only one is left.
	now := t0.Add(time.Minute)
	blocked := 0
	for range 1000 {
		got := obClaim(t, drv, now, 500)
		marked := 0
		for _, r := range got {
			if r.Key != freeKey {
				if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: r.ID, Error: "down", NextAttempt: t0.Add(time.Hour)}); err != nil {
					t.Fatal(err)
				}
				marked++
			}
		}
		if blocked += marked; blocked == len(rows)-1 {
			break
		}
	}
	if blocked != len(rows)-1 {
		t.Fatalf("%d rows marked failed, want %d", blocked, len(rows)-1)
	}
	for i := range 20 {
		limit := []int{1, 500}[i%2]
		got := obClaim(t, drv, now, limit)
		if len(got) != 1 || got[0].Key != freeKey {
			t.Fatalf("claim %d (limit %d) = %s; want the one claimable row, of %s", i, limit, obFmt(got), freeKey)
		}
	}
}

// Cleanup deletes published rows older than the cut-off, in batches, and
// never an unpublished or parked one. A row marked published twice keeps its
// first time.
func testOutboxDeletePublished[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	var in []driver.OutboxRow
	for i := range 10 {
		in = append(in, obRow(t, fmt.Sprintf("k%d", i), 1, t0))
	}
	rows := obStored(t, drv, in...)
	t1, t2 := t0.Add(time.Hour), t0.Add(2*time.Hour)
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(rows[:5]...), At: t1}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(rows[:8]...), At: t2}); err != nil { // 0..4 keep t1
		t.Fatalf("MarkPublished: %v", err)
	}
	if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: rows[8].ID, Error: "poison", At: t0}); err != nil {
		t.Fatalf("Park: %v", err)
	}
	del := func(before time.Time, limit, want int) {
		t.Helper()
		res, err := ex.OutboxDeletePublishedBefore(ctx, &driver.OutboxDeletePublishedBeforeParams{Before: before, Limit: limit})
		if err != nil || res.Deleted != want {
			t.Errorf("DeletePublishedBefore(%s, %d) = %d, %v; want %d", before.Sub(t0), limit, res.Deleted, err, want)
		}
	}
	del(t1, 10, 0) // strictly before
	del(t1.Add(time.Microsecond), 2, 2)
	del(t1.Add(time.Microsecond), 2, 2)
	del(t1.Add(time.Microsecond), 2, 1)
	del(t1.Add(time.Microsecond), 2, 0)
	del(t2.Add(time.Hour*1000), 100, 3)
	if _, err := ex.OutboxDeletePublishedBefore(ctx, &driver.OutboxDeletePublishedBeforeParams{Before: t2, Limit: 0}); err == nil {
		t.Error("DeletePublishedBefore with limit 0 succeeded; want an error")
	}
	obWantIDs(t, "after cleanup", obClaim(t, drv, t2, 10), rows[9])
	if oldest, ok, err := ex.OutboxOldestUnpublished(ctx); err != nil || !ok || !oldest.Equal(t0) {
		t.Errorf("OldestUnpublished after cleanup = %s, %v, %v; want the parked and the unpublished rows kept", oldest, ok, err)
	}
}

func testOutboxRedrive[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	// a1 a2 b1 c1 published at t1; a3 b2 at t2; c2 parked; a4 pending.
	rows := obStored(t, drv,
		obRow(t, "a", 1, t0), obRow(t, "a", 2, t0), obRow(t, "b", 1, t0), obRow(t, "c", 1, t0),
		obRow(t, "a", 3, t0), obRow(t, "b", 2, t0), obRow(t, "c", 2, t0), obRow(t, "a", 4, t0))
	t1, t2 := t0.Add(time.Hour), t0.Add(2*time.Hour)
	lastPublished := func(what string, want time.Time) {
		t.Helper()
		got, ok, err := ex.OutboxLastPublished(ctx)
		if err != nil || ok != !want.IsZero() || !got.Equal(want) {
			t.Errorf("%s: OutboxLastPublished = %s, %v, %v; want %s", what, got, ok, err, want)
		}
	}
	lastPublished("nothing published", time.Time{})
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(rows[4:6]...), At: t2}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	// Published at t1 after others were at t2 (the clock of another
	// relay): the latest time is still t2.
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(rows[:4]...), At: t1}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	lastPublished("published at t1 and t2", t2)
	if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: rows[6].ID, Error: "boom", NextAttempt: t0}); err != nil {
		t.Fatalf("MarkFailed: %v", err)
	}
	if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: rows[6].ID, Error: "poison", At: t0}); err != nil {
		t.Fatalf("Park: %v", err)
	}
	redrive := func(p *driver.OutboxRedriveParams, want int) {
		t.Helper()
		n, err := ex.OutboxRedrive(ctx, p)
		if err != nil || n != want {
			t.Fatalf("OutboxRedrive(%+v) = %d, %v; want %d", p, n, err, want)
		}
	}
	end := t2.Add(time.Hour)
	if _, err := ex.OutboxRedrive(ctx, &driver.OutboxRedriveParams{PublishedBefore: end}); err == nil {
		t.Error("OutboxRedrive with limit 0 succeeded; want an error")
	}
	if _, err := ex.OutboxRedrive(ctx, &driver.OutboxRedriveParams{Limit: 10}); err == nil {
		t.Error("OutboxRedrive without PublishedBefore succeeded; want an error")
	}
	// Nothing published in [t2+1us, end), nothing before t1.
	redrive(&driver.OutboxRedriveParams{PublishedSince: t2.Add(time.Microsecond), PublishedBefore: end, Limit: 10}, 0)
	redrive(&driver.OutboxRedriveParams{PublishedBefore: t1, Limit: 10}, 0)
	// Key filter, then the since bound: only b2 (published at t2).
	redrive(&driver.OutboxRedriveParams{PublishedSince: t2, PublishedBefore: end, Keys: []string{"b", "zz"}, Limit: 10}, 1)
	obWantIDs(t, "claim after redriving b since t2", obClaim(t, drv, end, 100), rows[5], rows[7])
	// The rest in batches of 2, the earliest published first: the rows
	// of t1, then a3; the parked and the pending rows are not touched.
	redrive(&driver.OutboxRedriveParams{PublishedBefore: end, Limit: 2}, 2)
	redrive(&driver.OutboxRedriveParams{PublishedBefore: end, Limit: 2}, 2)
	lastPublished("a3 left", t2)
	redrive(&driver.OutboxRedriveParams{PublishedBefore: end, Limit: 2}, 1)
	redrive(&driver.OutboxRedriveParams{PublishedBefore: end, Limit: 2}, 0)
	lastPublished("all redriven", time.Time{})
	// Every key's queue again in id order: a1..a4, b1 b2, and c1, which
	// precedes the parked c2 (still parked: never claimed).
	obWantIDs(t, "claim after redrive", obClaim(t, drv, end, 100),
		rows[0], rows[1], rows[2], rows[3], rows[4], rows[5], rows[7])
}

func testOutboxOldestUnpublished[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	check := func(what string, want time.Time, wantOK bool) {
		t.Helper()
		got, ok, err := ex.OutboxOldestUnpublished(ctx)
		if err != nil || ok != wantOK || (ok && !got.Equal(want)) {
			t.Errorf("%s: OldestUnpublished = %s, %v, %v; want %s, %v", what, got, ok, err, want, wantOK)
		}
	}
	check("empty", time.Time{}, false)
	rows := obStored(t, drv, obRow(t, "A", 1, t0), obRow(t, "B", 1, t0.Add(time.Second)), obRow(t, "C", 1, t0.Add(2*time.Second)))
	check("three unpublished", t0, true)
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(rows[0]), At: t0}); err != nil {
		t.Fatal(err)
	}
	check("first published", t0.Add(time.Second), true)
	if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: rows[1].ID, Error: "poison", At: t0}); err != nil {
		t.Fatal(err)
	}
	check("second parked", t0.Add(time.Second), true)
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(rows[2]), At: t0}); err != nil {
		t.Fatal(err)
	}
	check("only the parked one left", t0.Add(time.Second), true)
}

// OutboxCountParked counts the rows parked now: not the ones backing off,
// published or merely pending, nor a park rolled back; a parked row leaves
// the count once it is published (after an operator unparked it).
func testOutboxCountParked[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	check := func(what string, want int) {
		t.Helper()
		if got, err := ex.OutboxCountParked(ctx); err != nil || got != want {
			t.Errorf("%s: OutboxCountParked = %d, %v; want %d", what, got, err, want)
		}
	}
	park := func(ex driver.OutboxExecutor, r driver.OutboxRow) {
		t.Helper()
		if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: r.ID, Error: "poison", At: t0}); err != nil {
			t.Fatalf("Park: %v", err)
		}
	}
	check("empty", 0)
	// a1 a2 b1 c1 d1 e1: a1 and c1 parked, b1 backing off, d1 published.
	rows := obStored(t, drv, obRow(t, "a", 1, t0), obRow(t, "a", 2, t0), obRow(t, "b", 1, t0),
		obRow(t, "c", 1, t0), obRow(t, "d", 1, t0), obRow(t, "e", 1, t0))
	check("nothing parked", 0)
	park(ex, rows[0])
	park(ex, rows[3])
	if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: rows[2].ID, Error: "boom", NextAttempt: t0.Add(time.Hour)}); err != nil {
		t.Fatalf("MarkFailed: %v", err)
	}
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(rows[4]), At: t0}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	check("two parked, one backing off, one published", 2)
	// A park rolled back is not counted; one in a transaction is seen there.
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	park(drv.OutboxTx(tx), rows[5])
	if got, err := drv.OutboxTx(tx).OutboxCountParked(ctx); err != nil || got != 3 {
		t.Errorf("in the parking transaction: OutboxCountParked = %d, %v; want 3", got, err)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	check("a park rolled back", 2)
	// The row backing off parked at its last attempt.
	park(ex, rows[2])
	check("the failed row parked", 3)
	// c1 unparked by an operator, then published by the relay.
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(rows[3]), At: t0}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	check("a parked row published", 2)
}

// OutboxUnpark clears the parked state, attempts and backoff of parked
// rows only, selected by event ID, key and park time, in batches of
// Limit; rows pending, backing off or published, and unknown IDs, are not
// changed.
func testOutboxUnpark[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	// a1 a2 b1 c1 d1 e1 f1: a1 and c1 parked at t0, f1 at t2; b1 backing
	// off until t9; d1 published; a2 and e1 pending.
	rows := obStored(t, drv, obRow(t, "a", 1, t0), obRow(t, "a", 2, t0), obRow(t, "b", 1, t0),
		obRow(t, "c", 1, t0), obRow(t, "d", 1, t0), obRow(t, "e", 1, t0), obRow(t, "f", 1, t0))
	a1, a2, b1, c1, d1, e1, f1 := rows[0], rows[1], rows[2], rows[3], rows[4], rows[5], rows[6]
	t1, t2, t9 := t0.Add(time.Hour), t0.Add(2*time.Hour), t0.Add(9*time.Hour)
	park := func(r driver.OutboxRow, at time.Time) {
		t.Helper()
		if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: r.ID, Error: "boom", NextAttempt: at}); err != nil {
			t.Fatalf("MarkFailed: %v", err)
		}
		if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: r.ID, Error: "poison", At: at}); err != nil {
			t.Fatalf("Park: %v", err)
		}
	}
	park(a1, t0)
	park(c1, t0)
	park(f1, t2)
	if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: b1.ID, Error: "down", NextAttempt: t9}); err != nil {
		t.Fatalf("MarkFailed: %v", err)
	}
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(d1), At: t0}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	unpark := func(p *driver.OutboxUnparkParams, want int) {
		t.Helper()
		n, err := ex.OutboxUnpark(ctx, p)
		if err != nil || n != want {
			t.Fatalf("OutboxUnpark(%+v) = %d, %v; want %d", p, n, err, want)
		}
	}
	parked := func(what string, want int) {
		t.Helper()
		if got, err := ex.OutboxCountParked(ctx); err != nil || got != want {
			t.Errorf("%s: OutboxCountParked = %d, %v; want %d", what, got, err, want)
		}
	}
	// The latest park time of the rows parked now (b1 backing off until
	// t9 is not parked).
	lastParked := func(what string, want time.Time) {
		t.Helper()
		got, ok, err := ex.OutboxLastParked(ctx)
		if err != nil || ok != !want.IsZero() || !got.Equal(want) {
			t.Errorf("%s: OutboxLastParked = %s, %v, %v; want %s", what, got, ok, err, want)
		}
	}
	lastParked("a1 c1 parked at t0, f1 at t2", t2)
	if _, err := ex.OutboxUnpark(ctx, &driver.OutboxUnparkParams{}); err == nil {
		t.Error("OutboxUnpark with limit 0 succeeded; want an error")
	}
	// Not parked, unknown, or not matching both the IDs and the keys.
	unpark(&driver.OutboxUnparkParams{EventIDs: []uuid.UUID{b1.EventID, d1.EventID, e1.EventID, a2.EventID, uuid.New()}, Limit: 10}, 0)
	unpark(&driver.OutboxUnparkParams{Keys: []string{"b", "d", "e", "zz"}, Limit: 10}, 0)
	unpark(&driver.OutboxUnparkParams{EventIDs: []uuid.UUID{a1.EventID}, Keys: []string{"c"}, Limit: 10}, 0)
	unpark(&driver.OutboxUnparkParams{Keys: []string{"f"}, ParkedBefore: t1, Limit: 10}, 0)
	parked("after unparks that match nothing", 3)
	obWantIDs(t, "claim before unparking", obClaim(t, drv, t2, 100), e1)
	// By event ID.
	unpark(&driver.OutboxUnparkParams{EventIDs: []uuid.UUID{c1.EventID, b1.EventID}, Limit: 10}, 1)
	parked("c1 unparked", 2)
	// Parked before t1, one at a time: a1, then nothing (f1 was parked at t2).
	unpark(&driver.OutboxUnparkParams{ParkedBefore: t1, Limit: 1}, 1)
	unpark(&driver.OutboxUnparkParams{ParkedBefore: t1, Limit: 1}, 0)
	parked("a1 unparked", 1)
	lastParked("f1 left", t2)
	// Then every parked row: f1.
	unpark(&driver.OutboxUnparkParams{Limit: 10}, 1)
	unpark(&driver.OutboxUnparkParams{Limit: 10}, 0)
	parked("all unparked", 0)
	lastParked("all unparked", time.Time{})
	// Every unparked row is due at once with no attempts, and its key's
	// later rows follow it; b1 still backs off, with its attempt.
	got := obClaim(t, drv, t2, 100)
	obWantIDs(t, "claim after unparking", got, a1, a2, c1, e1, f1)
	for _, r := range got {
		if r.Attempts != 0 || !r.NextAttemptAt.IsZero() || !r.ParkedAt.IsZero() {
			t.Errorf("%s#%d after unpark: attempts %d, next attempt %s, parked at %s; want all cleared",
				r.Key, r.ID, r.Attempts, r.NextAttemptAt, r.ParkedAt)
		}
	}
	got = obClaim(t, drv, t9, 100)
	if len(got) != 6 || got[2].ID != b1.ID || got[2].Attempts != 1 || !got[2].NextAttemptAt.Equal(t9) {
		t.Errorf("claim at t9: %s (b1: %+v); want b1 with its attempt and backoff untouched", obFmt(got), got)
	}
}

// OutboxRetryNow makes the rows backing off past At due at At, attempts
// and errors kept, in batches of Limit; rows due already, parked, never
// failed or published are not changed.
func testOutboxRetryNow[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	// a1 a2 b1 c1 d1 e1 f1: a1 and f1 backing off until t9, b1 until t1;
	// c1 parked; d1 published; a2 and e1 never failed.
	rows := obStored(t, drv, obRow(t, "a", 1, t0), obRow(t, "a", 2, t0), obRow(t, "b", 1, t0),
		obRow(t, "c", 1, t0), obRow(t, "d", 1, t0), obRow(t, "e", 1, t0), obRow(t, "f", 1, t0))
	a1, a2, b1, c1, d1, e1, f1 := rows[0], rows[1], rows[2], rows[3], rows[4], rows[5], rows[6]
	t1, t2, t9 := t0.Add(time.Hour), t0.Add(2*time.Hour), t0.Add(9*time.Hour)
	fail := func(r driver.OutboxRow, until time.Time) {
		t.Helper()
		if err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: r.ID, Error: "broker down", NextAttempt: until}); err != nil {
			t.Fatalf("MarkFailed: %v", err)
		}
	}
	fail(a1, t9)
	fail(f1, t9)
	fail(b1, t1)
	fail(c1, t9)
	if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: c1.ID, Error: "poison", At: t0}); err != nil {
		t.Fatalf("Park: %v", err)
	}
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: obRowIDs(d1), At: t0}); err != nil {
		t.Fatalf("MarkPublished: %v", err)
	}
	retry := func(p *driver.OutboxRetryNowParams, want int) {
		t.Helper()
		n, err := ex.OutboxRetryNow(ctx, p)
		if err != nil || n != want {
			t.Fatalf("OutboxRetryNow(%+v) = %d, %v; want %d", p, n, err, want)
		}
	}
	if _, err := ex.OutboxRetryNow(ctx, &driver.OutboxRetryNowParams{At: t2}); err == nil {
		t.Error("OutboxRetryNow with limit 0 succeeded; want an error")
	}
	obWantIDs(t, "claim at t2 before", obClaim(t, drv, t2, 100), b1, e1)
	// a1 and f1, one at a time; b1 (due at t1) is not changed.
	retry(&driver.OutboxRetryNowParams{At: t2, Limit: 1}, 1)
	retry(&driver.OutboxRetryNowParams{At: t2, Limit: 1}, 1)
	retry(&driver.OutboxRetryNowParams{At: t2, Limit: 1}, 0)
	got := obClaim(t, drv, t2, 100)
	obWantIDs(t, "claim at t2 after", got, a1, a2, b1, e1, f1)
	for _, r := range got {
		switch r.ID {
		case a1.ID, f1.ID:
			if r.Attempts != 1 || r.LastError != "broker down" || !r.NextAttemptAt.Equal(t2) {
				t.Errorf("%s#%d: attempts %d, last error %q, next attempt %s; want 1, %q, %s",
					r.Key, r.ID, r.Attempts, r.LastError, r.NextAttemptAt, "broker down", t2)
			}
		case b1.ID:
			if !r.NextAttemptAt.Equal(t1) {
				t.Errorf("b1 next attempt %s; want %s (it was due before At)", r.NextAttemptAt, t1)
			}
		}
	}
	// c1 stays parked, and nothing is due before t2.
	if n, err := ex.OutboxCountParked(ctx); err != nil || n != 1 {
		t.Errorf("OutboxCountParked = %d, %v; want 1", n, err)
	}
	obWantIDs(t, "claim at t0", obClaim(t, drv, t0, 100), e1)
}

// ---- relay -----------------------------------------------------------------

func testRelayCommitted[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	e1, e2 := obEnvelope(t, "order-1", 1), obEnvelope(t, "order-1", 2)
	e1.SagaID = "saga-1"
	e1.Headers = map[string]string{"traceparent": "00-abc-01"}
	obEnqueue(t, drv, e1, e2)

	pub := &obPublisher{}
	var hooked []event.Envelope
	relay := obRelay(t, drv, pub, &outbox.RelayConfig{OnPublished: func(es []event.Envelope) { hooked = append(hooked, es...) }})
	n, err := relay.RunOnce(t.Context())
	if err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v; want 2 published", n, err)
	}
	got := pub.published()
	if len(got) != 2 || !obSameEnvelope(got[0], e1) || !obSameEnvelope(got[1], e2) {
		t.Fatalf("published %+v; want exactly the enqueued envelopes %+v, %+v", got, e1, e2)
	}
	if len(hooked) != 2 {
		t.Errorf("OnPublished saw %d events; want 2", len(hooked))
	}
	if n, err := relay.RunOnce(t.Context()); n != 0 || err != nil {
		t.Errorf("second RunOnce = %d, %v; want nothing left to publish", n, err)
	}
	if obPending(t, drv) {
		t.Error("rows still unpublished after the relay published them")
	}
	if c := pub.callCount(); c != 1 {
		t.Errorf("Publish called %d times; want 1 (an empty batch is not published)", c)
	}
}

func obSameEnvelope(a, b event.Envelope) bool {
	return a.ID == b.ID && a.Type == b.Type && a.Key == b.Key && a.SagaID == b.SagaID &&
		a.OccurredAt.Equal(b.OccurredAt) && string(a.Payload) == string(b.Payload) &&
		(len(a.Headers) == 0 && len(b.Headers) == 0 || reflect.DeepEqual(a.Headers, b.Headers))
}

func testRelayRedrive[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	old := []event.Envelope{obEnvelope(t, "k1", 1), obEnvelope(t, "k1", 2), obEnvelope(t, "k2", 1)}
	obEnqueue(t, drv, old...)
	pub := &obPublisher{}
	relay := obRelay(t, drv, pub, nil)
	if n, err := relay.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("RunOnce = %d, %v; want 3", n, err)
	}
	since := time.Now()
	newer := []event.Envelope{obEnvelope(t, "k1", 3), obEnvelope(t, "k3", 1)}
	obEnqueue(t, drv, newer...)
	if n, err := relay.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v; want 2", n, err)
	}
	// Redrive the last publication only, then everything.
	if n, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{Since: since}); err != nil || n != 2 {
		t.Fatalf("Redrive(since the second round) = %d, %v; want 2", n, err)
	}
	if n, err := relay.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RunOnce after a redrive = %d, %v; want 2", n, err)
	}
	if n, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{Keys: []string{"k1"}, BatchSize: 1}); err != nil || n != 3 {
		t.Fatalf("Redrive(k1) = %d, %v; want 3", n, err)
	}
	if n, err := relay.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("RunOnce after a redrive = %d, %v; want 3", n, err)
	}
	got := pub.published()
	want := []uuid.UUID{old[0].ID, old[1].ID, old[2].ID, newer[0].ID, newer[1].ID, newer[0].ID, newer[1].ID, old[0].ID, old[1].ID, newer[0].ID}
	if g := obEnvIDs(got); !reflect.DeepEqual(g, want) {
		t.Fatalf("published %v; want %v (same IDs, each key in order)", g, want)
	}
	for _, e := range got {
		if orig := obFind(append(old, newer...), e.ID); !obSameEnvelope(e, orig) {
			t.Errorf("republished %+v differs from the enqueued %+v", e, orig)
		}
	}
	if _, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{BatchSize: -1}); err == nil {
		t.Error("Redrive with a negative BatchSize succeeded")
	}
}

func testRelayRolledBack[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	tx := begin(t, drv)
	if err := outbox.EnqueueTx(ctx, drv, tx, obEnvelope(t, "order-1", 1)); err != nil {
		t.Fatalf("EnqueueTx: %v", err)
	}
	rollback(t, drv, tx)
	committed := obEnvelope(t, "order-2", 1)
	obEnqueue(t, drv, committed)

	pub := &obPublisher{}
	relay := obRelay(t, drv, pub, nil)
	if n, err := relay.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RunOnce = %d, %v; want 1", n, err)
	}
	if got := pub.published(); len(got) != 1 || got[0].ID != committed.ID {
		t.Errorf("published %v; want only the committed event", got)
	}
}

// Enqueuing the same envelope again (a retried operation) publishes it once.
func testRelayDuplicateEnqueue[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	e := obEnvelope(t, "order-1", 1)
	obEnqueue(t, drv, e)
	obEnqueue(t, drv, e, e)
	pub := &obPublisher{}
	relay := obRelay(t, drv, pub, nil)
	obDrain(t, drv, relay, nil)
	obEnqueue(t, drv, e) // even after it was published
	obDrain(t, drv, relay, nil)
	if got := pub.published(); len(got) != 1 || got[0].ID != e.ID {
		t.Errorf("published %d events; want the event once", len(got))
	}
}

func testRelayEnqueueInvalid[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	good := obEnvelope(t, "k", 1)
	bad := obEnvelope(t, "k", 2)
	bad.Key = ""
	tx := begin(t, drv)
	if err := outbox.EnqueueTx(ctx, drv, tx, good, bad); !errors.Is(err, event.ErrEmptyKey) {
		t.Errorf("Enqueue with an invalid envelope = %v; want event.ErrEmptyKey", err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx); err != nil {
		t.Errorf("Enqueue of nothing: %v", err)
	}
	// No transaction (one not threaded through): refused, not stored on
	// its own outside the business transaction.
	var none TTx
	if err := outbox.EnqueueTx(ctx, drv, none, good); err == nil {
		t.Error("Enqueue with a nil transaction succeeded")
	}
	commit(t, drv, tx)
	if obPending(t, drv) {
		t.Error("a batch with an invalid envelope, or one without a transaction, stored some of it")
	}
}

// 3 keys x 100 events, enqueued in small transactions while the relay runs,
// with a publisher that fails at random: sometimes part-way through a batch
// (PublishError), sometimes after publishing everything (the acknowledgement
// was lost). Every key's events arrive in order; an event arrives twice only
// as a republication after a failed call.
func testRelayOrderWithFailures[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 42))
	var rngMu sync.Mutex
	intn := func(n int) int {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.IntN(n)
	}

	keys := []string{"acct-1", "acct-2", "acct-3"}
	const perKey = 100
	want := map[string][]uuid.UUID{}
	var all []event.Envelope
	for i := range perKey {
		for _, k := range keys {
			e := obEnvelope(t, k, i)
			want[k] = append(want[k], e.ID)
			all = append(all, e)
		}
	}
	// Shuffle across keys, keeping each key's order.
	var mixed []event.Envelope
	idx := map[string]int{}
	for len(mixed) < len(all) {
		k := keys[intn(len(keys))]
		if idx[k] < perKey {
			mixed = append(mixed, obFind(all, want[k][idx[k]]))
			idx[k]++
		}
	}

	pub := &obPublisher{fail: func(_ int, events []event.Envelope) ([]bool, error) {
		switch intn(10) {
		case 0, 1: // stops part-way
			i := intn(len(events))
			return obPrefix(len(events), i), outbox.PrefixError(len(events), i, errBroker)
		case 2, 3: // some partitions fail: per event, and a key stops at its first failure
			ok := make([]bool, len(events))
			errs := make([]error, len(events))
			failed := map[string]bool{}
			for i, e := range events {
				switch {
				case failed[e.Key]:
					errs[i] = fmt.Errorf("%w: earlier record of the partition failed", errBroker)
				case intn(4) == 0:
					failed[e.Key] = true
					errs[i] = errBroker
				default:
					ok[i] = true
				}
			}
			return ok, &outbox.PublishError{Errs: errs}
		case 4: // everything went out, the acknowledgement was lost
			return nil, fmt.Errorf("ack lost: %w", errBroker)
		}
		return nil, nil
	}}
	relay := obRelay(t, drv, pub, &outbox.RelayConfig{
		BatchSize: 16,
		Backoff:   func(int) time.Duration { return time.Duration(intn(3)) * time.Millisecond },
		Logger:    obQuietLogger(),
	})

	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(mixed) > 0 {
			n := min(1+intn(5), len(mixed))
			obEnqueue(t, drv, mixed[:n]...)
			mixed = mixed[n:]
		}
	}()
	start := time.Now()
	obDrain(t, drv, relay, done)
	pub.mu.Lock()
	defer pub.mu.Unlock()
	t.Logf("%d events in %d Publish calls, %d deliveries (%d republications) in %s",
		len(all), pub.calls, len(pub.got), len(pub.got)-len(all), time.Since(start).Round(time.Millisecond))
	obCheckOrder(t, pub.got, want, pub.unacked, false)
}

func obFind(all []event.Envelope, id uuid.UUID) event.Envelope {
	for _, e := range all {
		if e.ID == id {
			return e
		}
	}
	panic("not found")
}

// A key whose events the publisher keeps rejecting waits for its retries;
// the other keys are published meanwhile, and the failing key's later
// events are not published before its head.
func testRelayFailingKey[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	bad1, bad2 := obEnvelope(t, "bad", 1), obEnvelope(t, "bad", 2)
	obEnqueue(t, drv, bad1) // the oldest event: first in every batch
	want := map[string][]uuid.UUID{}
	for i := range 10 {
		for _, k := range []string{"good-1", "good-2"} {
			e := obEnvelope(t, k, i)
			want[k] = append(want[k], e.ID)
			obEnqueue(t, drv, e)
		}
	}
	obEnqueue(t, drv, bad2)

	pub := &obPublisher{fail: failAtKey("bad")}
	relay := obRelay(t, drv, pub, &outbox.RelayConfig{
		BatchSize: 8,
		Backoff:   func(int) time.Duration { return time.Hour },
		Logger:    obQuietLogger(),
	})
	for range 10 {
		_, _ = relay.RunOnce(t.Context())
	}
	got := pub.published()
	obCheckOrder(t, got, want, nil, true)
	for _, e := range got {
		if e.Key == "bad" {
			t.Errorf("published %s of the failing key", e.ID)
		}
	}
	rows := obClaim(t, drv, time.Now().Add(2*time.Hour), 10)
	if len(rows) != 2 || rows[0].EventID != bad1.ID || rows[0].Attempts != 1 || rows[0].LastError == "" || rows[1].Attempts != 0 {
		t.Errorf("failing key's rows after the rounds: %+v; want its head with 1 failed attempt and its second event untouched", rows)
	}
}

// A publisher that reports per event: the published ones are marked
// whatever their position, each failed key head is backed off, a poison
// event is parked at once, and skipped events are retried without a
// failed attempt.
func testRelayPerEventResults[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	a1, b1, a2, c1, b2, d1 := obEnvelope(t, "A", 1), obEnvelope(t, "B", 1), obEnvelope(t, "A", 2),
		obEnvelope(t, "C", 1), obEnvelope(t, "B", 2), obEnvelope(t, "D", 1)
	obEnqueue(t, drv, a1, b1, a2, c1, b2, d1)
	pub := &obPublisher{fail: func(call int, events []event.Envelope) ([]bool, error) {
		if call > 1 {
			return nil, nil
		}
		return []bool{true, false, true, false, false, false}, &outbox.PublishError{Errs: []error{
			nil,
			fmt.Errorf("partition leader gone: %w", errBroker),
			nil,
			fmt.Errorf("%w: record too large", outbox.ErrPoison),
			fmt.Errorf("%w: earlier record of the partition failed", outbox.ErrSkipped),
			fmt.Errorf("%w: gave up", outbox.ErrSkipped),
		}}
	}}
	var parked []uuid.UUID
	relay := obRelay(t, drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return time.Hour },
		OnPark:  func(e event.Envelope, _ int, _ error) { parked = append(parked, e.ID) },
		Logger:  obQuietLogger(),
	})
	n, err := relay.RunOnce(t.Context())
	if n != 2 || !errors.Is(err, errBroker) || !errors.Is(err, outbox.ErrPoison) {
		t.Fatalf("RunOnce = %d, %v; want 2 published and the batch's errors", n, err)
	}
	if len(parked) != 1 || parked[0] != c1.ID {
		t.Errorf("parked %v; want the poison event %s only, at its first failure", parked, c1.ID)
	}
	left := obClaim(t, drv, time.Now().Add(2*time.Hour), 10)
	if len(left) != 3 || left[0].EventID != b1.ID || left[0].Attempts != 1 ||
		left[1].EventID != b2.ID || left[1].Attempts != 0 || left[2].EventID != d1.ID || left[2].Attempts != 0 {
		t.Errorf("unpublished after the round: %+v; want B1 (1 failed attempt), B2 and D1 (skipped: no attempt)", left)
	}
	// Next round: D1 goes, B waits for its head's backoff, C is parked.
	if n, err := relay.RunOnce(t.Context()); n != 1 || err != nil {
		t.Errorf("second RunOnce = %d, %v; want D1 published", n, err)
	}
	want := []uuid.UUID{a1.ID, a2.ID, d1.ID}
	if got := obEnvIDs(pub.published()); !reflect.DeepEqual(got, want) {
		t.Errorf("published %v; want %v", got, want)
	}
}

func obEnvIDs(es []event.Envelope) []uuid.UUID {
	out := make([]uuid.UUID, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

// After MaxAttempts failures an event is parked: kept, never retried,
// reported, and blocking its own key only.
func testRelayPoison[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	p1 := obEnvelope(t, "poison", 1)
	obEnqueue(t, drv, p1, obEnvelope(t, "poison", 2))
	ok := obEnvelope(t, "fine", 1)
	obEnqueue(t, drv, ok)

	pub := &obPublisher{fail: failAtKey("poison")}
	var (
		parked   []event.Envelope
		attempts int
		lag      atomic.Int64
	)
	relay := obRelay(t, drv, pub, &outbox.RelayConfig{
		MaxAttempts: 3,
		Backoff:     func(int) time.Duration { return 0 },
		OnPark: func(e event.Envelope, n int, err error) {
			parked = append(parked, e)
			attempts = n
			if !errors.Is(err, errBroker) {
				t.Errorf("OnPark error %v; want the publish error", err)
			}
		},
		OnLag:  func(d time.Duration) { lag.Store(int64(d)) },
		Logger: obQuietLogger(),
	})
	for range 6 {
		_, _ = relay.RunOnce(t.Context())
	}
	if len(parked) != 1 || parked[0].ID != p1.ID || attempts != 3 {
		t.Fatalf("parked %v after %d attempts; want the poison head once, after 3", parked, attempts)
	}
	calls := pub.callCount()
	for range 3 {
		if n, err := relay.RunOnce(t.Context()); n != 0 || err != nil {
			t.Errorf("RunOnce after parking = %d, %v; want nothing to do", n, err)
		}
	}
	if c := pub.callCount(); c != calls {
		t.Errorf("Publish called %d more times after the event was parked", c-calls)
	}
	got := pub.published()
	if len(got) != 1 || got[0].ID != ok.ID {
		t.Errorf("published %v; want only the other key's event", got)
	}
	if lag.Load() <= 0 {
		t.Error("OnLag reported no lag while a parked event waits")
	}
	// A new event of the other key still flows; one of the parked key does not.
	late := obEnvelope(t, "fine", 2)
	obEnqueue(t, drv, late, obEnvelope(t, "poison", 3))
	if n, _ := relay.RunOnce(t.Context()); n != 1 {
		t.Errorf("RunOnce after a new event of a healthy key published %d; want 1", n)
	}
	if !obPending(t, drv) {
		t.Error("the parked events are gone; want them kept")
	}
}

// A poison event parked by the relay (its publisher answered ErrPoison)
// holds its key's later events; once the cause is fixed, outbox.Unpark
// makes the relay publish it and then the held events, in order. Unparking
// events that are not parked changes nothing.
func testRelayUnpark[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	p1, p2, p3 := obEnvelope(t, "poison", 1), obEnvelope(t, "poison", 2), obEnvelope(t, "poison", 3)
	ok := obEnvelope(t, "fine", 1)
	obEnqueue(t, drv, p1, p2, ok)
	var fixed atomic.Bool
	pub := &obPublisher{fail: func(_ int, events []event.Envelope) ([]bool, error) {
		if fixed.Load() {
			return nil, nil
		}
		for i, e := range events {
			if e.ID == p1.ID {
				return obPrefix(len(events), i), outbox.PrefixError(len(events), i, fmt.Errorf("too large: %w", outbox.ErrPoison))
			}
		}
		return nil, nil
	}}
	var parked []uuid.UUID
	relay := obRelay(t, drv, pub, &outbox.RelayConfig{
		OnPark: func(e event.Envelope, _ int, _ error) { parked = append(parked, e.ID) },
		Logger: obQuietLogger(),
	})
	for range 3 {
		_, _ = relay.RunOnce(ctx)
	}
	obEnqueue(t, drv, p3)
	if n, err := relay.RunOnce(ctx); n != 0 || err != nil {
		t.Fatalf("RunOnce with the key parked = %d, %v; want nothing to do", n, err)
	}
	if len(parked) != 1 || parked[0] != p1.ID {
		t.Fatalf("parked %v; want %s once", parked, p1.ID)
	}
	if got := obEnvIDs(pub.published()); !reflect.DeepEqual(got, []uuid.UUID{ok.ID}) {
		t.Fatalf("published %v; want only %s", got, ok.ID)
	}
	// Unparking what is not parked: published, held, unknown.
	if n, err := outbox.Unpark(ctx, drv, outbox.UnparkOptions{EventIDs: []uuid.UUID{ok.ID, p2.ID, uuid.New()}}); n != 0 || err != nil {
		t.Errorf("Unpark of events not parked = %d, %v; want 0", n, err)
	}
	if n, err := outbox.Unpark(ctx, drv, outbox.UnparkOptions{Keys: []string{"fine"}}); n != 0 || err != nil {
		t.Errorf("Unpark of a key with nothing parked = %d, %v; want 0", n, err)
	}
	if n, err := relay.RunOnce(ctx); n != 0 || err != nil {
		t.Fatalf("RunOnce after unparking nothing = %d, %v; want nothing to do", n, err)
	}
	for _, bad := range []outbox.UnparkOptions{{}, {All: true, Keys: []string{"poison"}}, {All: true, EventIDs: []uuid.UUID{p1.ID}}, {All: true, BatchSize: -1}} {
		if _, err := outbox.Unpark(ctx, drv, bad); err == nil {
			t.Errorf("Unpark(%+v) succeeded; want an error", bad)
		}
	}
	// Fixed, unparked (twice: the second finds nothing): published, then
	// the events it held, in order.
	fixed.Store(true)
	if n, err := outbox.Unpark(ctx, drv, outbox.UnparkOptions{EventIDs: []uuid.UUID{p1.ID, p1.ID}}); n != 1 || err != nil {
		t.Fatalf("Unpark(%s) = %d, %v; want 1", p1.ID, n, err)
	}
	if n, err := outbox.Unpark(ctx, drv, outbox.UnparkOptions{All: true}); n != 0 || err != nil {
		t.Fatalf("Unpark(All) after the unpark = %d, %v; want 0", n, err)
	}
	if n, err := relay.RunOnce(ctx); n != 3 || err != nil {
		t.Fatalf("RunOnce after the unpark = %d, %v; want 3", n, err)
	}
	if got, want := obEnvIDs(pub.published()), []uuid.UUID{ok.ID, p1.ID, p2.ID, p3.ID}; !reflect.DeepEqual(got, want) {
		t.Errorf("published %v; want %v", got, want)
	}
	if obPending(t, drv) {
		t.Error("events left unpublished after the unpark")
	}
}

// obMarkFails wraps a driver whose OutboxMarkPublished fails while fail is
// set: the relay has published and cannot record it, as if it crashed or
// lost its database between the two.
type obMarkFails[TTx any] struct {
	driver.Driver[TTx]
	fail *atomic.Bool
}

func (d obMarkFails[TTx]) OutboxTx(tx TTx) driver.OutboxExecutor {
	return obMarkFailsExec{d.Driver.OutboxTx(tx), d.fail}
}

type obMarkFailsExec struct {
	driver.OutboxExecutor
	fail *atomic.Bool
}

var errMarkLost = errors.New("connection lost before the marks")

func (e obMarkFailsExec) OutboxMarkPublished(ctx context.Context, p *driver.OutboxMarkPublishedParams) error {
	if e.fail.Load() {
		return errMarkLost
	}
	return e.OutboxExecutor.OutboxMarkPublished(ctx, p)
}

// Published, then the marks are lost: the next relay publishes the same
// events again, with the same IDs, in the same order.
func testRelayMarkFails[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	var events []event.Envelope
	for i := range 3 {
		events = append(events, obEnvelope(t, "order-1", i))
	}
	obEnqueue(t, drv, events...)
	pub := &obPublisher{}
	var fail atomic.Bool
	fail.Store(true)
	crashing := obRelay[TTx](t, obMarkFails[TTx]{drv, &fail}, pub, &outbox.RelayConfig{Logger: obQuietLogger()})
	if n, err := crashing.RunOnce(t.Context()); !errors.Is(err, errMarkLost) || n != 0 {
		t.Fatalf("RunOnce with failing marks = %d, %v; want 0 and the mark error", n, err)
	}
	if len(pub.published()) != 3 {
		t.Fatalf("published %d events before the marks failed; want 3", len(pub.published()))
	}

	restarted := obRelay(t, drv, pub, nil)
	if n, err := restarted.RunOnce(t.Context()); n != 3 || err != nil {
		t.Fatalf("RunOnce after the crash = %d, %v; want the 3 events again", n, err)
	}
	got := pub.published()
	for i, e := range events {
		if got[i].ID != e.ID || got[3+i].ID != e.ID {
			t.Errorf("publication %d: ids %s then %s; want %s both times", i, got[i].ID, got[3+i].ID, e.ID)
		}
	}
	if obPending(t, drv) {
		t.Error("events still unpublished after the second relay")
	}
}

// A publisher that panics after publishing (the process dies) leaves the
// claim released and the rows unmarked: another relay republishes them.
func testRelayPublisherPanics[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	e := obEnvelope(t, "order-1", 1)
	obEnqueue(t, drv, e)
	pub := &obPublisher{}
	dying := obRelay(t, drv, outbox.PublisherFunc(func(ctx context.Context, es []event.Envelope) error {
		_ = pub.Publish(ctx, es)
		panic("process killed")
	}), nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("RunOnce did not propagate the publisher's panic")
			}
		}()
		_, _ = dying.RunOnce(t.Context())
	}()
	other := obRelay(t, drv, pub, nil)
	if n, err := other.RunOnce(t.Context()); n != 1 || err != nil {
		t.Fatalf("RunOnce after the crash = %d, %v; want the event again", n, err)
	}
	if got := pub.published(); len(got) != 2 || got[0].ID != e.ID || got[1].ID != e.ID {
		t.Errorf("published %v; want the same event twice", got)
	}
}

// Several relays at once on a backend with concurrent writers: every event
// exactly once, each key in order.
func testRelayConcurrent[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	want := map[string][]uuid.UUID{}
	var batch []event.Envelope
	for i := range 40 {
		for k := range 10 {
			e := obEnvelope(t, fmt.Sprintf("key-%d", k), i)
			want[e.Key] = append(want[e.Key], e.ID)
			batch = append(batch, e)
		}
		if len(batch) >= 25 {
			obEnqueue(t, drv, batch...)
			batch = nil
		}
	}
	obEnqueue(t, drv, batch...)

	pub := &obPublisher{delay: time.Millisecond}
	var wg sync.WaitGroup
	for range 4 {
		relay := obRelay(t, drv, pub, &outbox.RelayConfig{BatchSize: 10})
		wg.Go(func() {
			for obPending(t, drv) {
				if _, err := relay.RunOnce(t.Context()); err != nil {
					t.Errorf("RunOnce: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	obCheckOrder(t, pub.published(), want, nil, true)
}

// Run publishes as events arrive (here by polling), reports lag and
// published events, and returns nil when its context ends.
func testRelayRun[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	pub := &obPublisher{}
	published := make(chan int, 100)
	var lastLag atomic.Int64
	lastLag.Store(-1)
	relay := obRelay(t, drv, pub, &outbox.RelayConfig{
		PollInterval: 10 * time.Millisecond,
		OnPublished:  func(es []event.Envelope) { published <- len(es) },
		OnLag:        func(d time.Duration) { lastLag.Store(int64(d)) },
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()

	obEnqueue(t, drv, obEnvelope(t, "k", 1), obEnvelope(t, "k", 2))
	total := 0
	timeout := time.After(10 * time.Second)
	for total < 2 {
		select {
		case n := <-published:
			total += n
		case <-timeout:
			t.Fatalf("Run published %d of 2 events in 10s", total)
		}
	}
	if err := relay.Run(ctx); !errors.Is(err, outbox.ErrRunning) {
		t.Errorf("second concurrent Run = %v; want ErrRunning", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for lastLag.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l := lastLag.Load(); l != 0 {
		t.Errorf("OnLag = %s after everything was published; want 0", time.Duration(l))
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel = %v; want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return 5s after its context was cancelled")
	}
}
