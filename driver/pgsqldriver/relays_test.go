package pgsqldriver_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// Relays on three replicas (three *sql.DB of two connections, no idle
// connection kept, a lifetime of 30ms) while events are enqueued; one
// replica dies in the middle of a round (its publisher stuck, its context
// cancelled and its pool closed): the lanes it held go to the others,
// every event is published exactly once, each key in order, and no row is
// left pending.
func TestOutboxRelaysOnReplicas(t *testing.T) {
	t.Parallel()
	drv, schema := testdb.PostgresSQLSchema(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		mu  sync.Mutex
		got []event.Envelope
		wg  sync.WaitGroup
	)
	// replica starts a relay on a pool of its own; a stuck one's publisher
	// never returns until its context ends. kill ends it.
	replica := func(stuck bool) (kill func(), claimed <-chan struct{}) {
		db := testdb.SQLPool(t, schema, 2)
		db.SetMaxIdleConns(0)
		db.SetConnMaxLifetime(30 * time.Millisecond)
		d, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		inRound := make(chan struct{})
		var once sync.Once
		pub := outbox.PublisherFunc(func(pctx context.Context, batch []event.Envelope) error {
			if stuck {
				once.Do(func() { close(inRound) })
				<-pctx.Done()
				return errors.New("replica died")
			}
			time.Sleep(time.Millisecond)
			mu.Lock()
			got = append(got, batch...)
			mu.Unlock()
			return nil
		})
		relay, err := outbox.NewRelay(d, pub, &outbox.RelayConfig{BatchSize: 7, PollInterval: 5 * time.Millisecond, Concurrency: 2})
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithCancel(ctx)
		wg.Go(func() { _ = relay.Run(rctx) })
		return func() { rcancel(); _ = db.Close() }, inRound
	}
	// The stuck replica runs alone until it is in a round (with the two
	// others already running, it could find nothing left to claim: they
	// may take every lane first), then the others start, and it dies
	// later, mid-round, while they publish.
	kill, stuckInRound := replica(true)

	const keys, perKey = 8, 60
	want := map[string][]uuid.UUID{}
	for i := range perKey {
		var batch []event.Envelope
		for k := range keys {
			e, err := event.New("Test.Happened.v1", fmt.Sprintf("key-%d", k), map[string]int{"seq": i})
			if err != nil {
				t.Fatal(err)
			}
			want[e.Key] = append(want[e.Key], e.ID)
			batch = append(batch, e)
		}
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.EnqueueTx(ctx, drv, tx, batch...); err != nil {
			t.Fatal(err)
		}
		if err := drv.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		switch i {
		case 0:
			select {
			case <-stuckInRound:
			case <-time.After(10 * time.Second):
				t.Fatal("the stuck replica, alone, claimed nothing in 10s")
			}
			replica(false)
			replica(false)
		case 5:
			kill()
		}
	}
	published := func() []event.Envelope {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	for deadline := time.Now().Add(30 * time.Second); len(published()) < keys*perKey && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a duplicate would show up now
	cancel()
	wg.Wait()

	perKeyGot := map[string][]uuid.UUID{}
	all := published()
	for _, e := range all {
		perKeyGot[e.Key] = append(perKeyGot[e.Key], e.ID)
	}
	for key, ids := range want {
		if !slices.Equal(perKeyGot[key], ids) {
			t.Errorf("key %s: published %d events; want %d exactly once in enqueue order", key, len(perKeyGot[key]), len(ids))
		}
	}
	if len(all) != keys*perKey {
		t.Errorf("published %d events; want %d", len(all), keys*perKey)
	}
	if _, ok, err := drv.Outbox().OutboxOldestUnpublished(t.Context()); err != nil || ok {
		t.Errorf("OutboxOldestUnpublished after the relays: %v, %v; want nothing left", ok, err)
	}
}
