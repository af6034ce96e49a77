package idemkafka_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

// A consumer stopped while its inbox COMMIT hangs (a stalled server or
// network; here a deferred trigger sleeping) returns after the inbox's
// commit grace, not when the COMMIT one day ends: the consumer runs its
// transactions on a context detached from Run's so that a batch under way
// may finish, and its stop must still start the grace period. Nothing is
// committed, so the next consumer applies every record once.
func TestStopWithHungCommitReturns(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	b := setupPostgres(t)
	drv := b.open(t)
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testdb.SlowCommit(t, func(q string) error { _, err := tx.Exec(ctx, q); return err })
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}

	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 5, 2)

	var hung, slowed atomic.Bool
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	effect := cfg.Handler
	entered := make(chan struct{}, 1)
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
		if err := effect(ctx, tx, e); err != nil {
			return err
		}
		if hung.Load() || !slowed.CompareAndSwap(false, true) {
			return nil // one slow row: an unfixed consumer fails in 60s, not 60s per row
		}
		if _, err := tx.Exec(ctx, `INSERT INTO slow_commit VALUES (1)`); err != nil {
			return err
		}
		select {
		case entered <- struct{}{}:
		default:
		}
		return nil
	}
	inst := start(t, b, "billing", cfg)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}
	time.Sleep(500 * time.Millisecond) // the batch's COMMIT is now hanging

	stopped := time.Now()
	inst.cancel()
	select {
	case err := <-inst.done:
		close(inst.done)
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its context ending while a COMMIT hung; want it back after the commit grace")
	}
	if took := time.Since(stopped); took > 15*time.Second {
		t.Errorf("Run returned %s after its context ended; want the hung COMMIT cancelled after the grace period", took.Round(time.Second))
	}
	if n := len(b.rows(t, "billing")); n != 0 {
		t.Fatalf("%d effects committed by the cancelled COMMIT; want 0", n)
	}

	hung.Store(true)
	again := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, again)
	mustOnce(t, b, "billing", evs)
}
