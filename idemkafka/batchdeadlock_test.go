package idemkafka_test

import (
	"database/sql"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/kafkatest"
)

// A batch handler that fails with a database error (here a deadlock, as
// two consumers bulk-upserting overlapping rows get) says nothing about
// its records: the batch is retried whole, as the Handler's database
// failures are, not degraded to one transaction per record; and nothing is dead-lettered.
func TestBatchHandlerDatabaseErrorRetriesTheBatch(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testBatchHandlerDeadlock[pgx.Tx], testBatchHandlerDeadlock[*sql.Tx])
}

func testBatchHandlerDeadlock[TTx any](t *testing.T, b *backend[TTx]) {
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 40, 4)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	var (
		calls  bulkCalls
		failed atomic.Bool
	)
	cfg := batchConfig(kc, b, "billing", group, &calls, func(evs []event.Envelope) error {
		if len(evs) > 1 && failed.CompareAndSwap(false, true) {
			return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
		}
		return nil
	}, topic)
	inst := start(t, b, "billing", cfg)
	waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	mustOnce(t, b, "billing", evs)
	if !failed.Load() {
		t.Fatal("the batch handler was never called with several events; the test proves nothing")
	}
	sizes, _ := calls.get()
	i := slices.IndexFunc(sizes, func(n int) bool { return n > 1 })
	if i+1 >= len(sizes) || sizes[i+1] != sizes[i] {
		t.Fatalf("batch handler call sizes %v: after the deadlock on %d events, want the same %d retried in one call", sizes, sizes[i], sizes[i])
	}
	if s := inst.stats.get(); s.dead != 0 {
		t.Errorf("stats: dead-lettered %d; want 0 (a database failure is not the records')", s.dead)
	}
}
