package idemkafka_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// Outbox -> relay -> Publisher -> Kafka -> Consumer. The relay publishes a
// batch and then fails before marking it published (as a relay that
// crashed between the two would), so it publishes the same events again:
// the log holds every event twice, and the consumer's inbox applies each
// once.
func TestRelayRepublishDropped(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 3)
	ctx := t.Context()
	drv := b.open(t)
	evs := newEvents(t, 30, 5)
	enqueue(t, drv, evs...)

	pub := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic})
	var crashed atomic.Bool
	crashOnce := outbox.PublisherFunc(func(ctx context.Context, events []event.Envelope) error {
		if err := pub.Publish(ctx, events); err != nil {
			return err
		}
		if crashed.CompareAndSwap(false, true) {
			return errors.New("relay lost before marking the batch published")
		}
		return nil
	})
	relay, err := outbox.NewRelay(drv, crashOnce, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return time.Millisecond },
		Logger:  testLogger(),
	})
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	published := 0
	for deadline := time.Now().Add(20 * time.Second); published < len(evs); {
		if time.Now().After(deadline) {
			t.Fatalf("relay published %d of %d events", published, len(evs))
		}
		n, _ := relay.RunOnce(ctx)
		published += n
		time.Sleep(5 * time.Millisecond)
	}
	if got := len(kc.Records(t, topic)); got != 2*len(evs) {
		t.Fatalf("log holds %d records; want every event twice (%d)", got, 2*len(evs))
	}

	group := kafkatest.Name("g")
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "the log consumed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
	mustKeyOrder(t, b.rows(t, "billing"))
	if s := inst.stats.get(); s.applied != len(evs) || s.duplicates != len(evs) {
		t.Errorf("consumer applied %d, skipped %d; want %d and %d", s.applied, s.duplicates, len(evs), len(evs))
	}
}
