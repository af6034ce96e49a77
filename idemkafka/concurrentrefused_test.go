package idemkafka_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// The relay runs two batches at once (RelayConfig.Concurrency) through one
// Publisher, whose client puts the records of both into one record batch.
// On a topic whose max.message.bytes is below kgo's batch size the broker
// refuses that batch, and kgo fails every record of it: a batch of one
// small event was taken for poison (its "alone" record had travelled with
// the other call's), and so were small events produced one at a time while
// the other call's batch was refused. Only the event too large for the
// topic is poison.
func TestConcurrentPublishRefusedBatchNotPoison(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kafkatest.Name("orders")
	kc.CreateTopicConfig(t, topic, 1, map[string]string{"max.message.bytes": "65536"})
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Logger: testLogger(), ExtraOpts: []kgo.Opt{kgo.ProducerLinger(100 * time.Millisecond)}})
	small := func(key string) event.Envelope {
		e, err := event.New("OrderCreated.v1", key, map[string]string{"pad": hex.EncodeToString(randomBytes(2000))})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	big, err := event.New("OrderCreated.v1", "big-0", map[string]string{"pad": hex.EncodeToString(randomBytes(100 << 10))})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		batches := [][]event.Envelope{{small(fmt.Sprintf("single-%d", round))}}
		for b := range 3 {
			evs := make([]event.Envelope, 40)
			for i := range evs {
				evs[i] = small(fmt.Sprintf("r%d-b%d-%d", round, b, i))
			}
			batches = append(batches, evs)
		}
		batches[1][0] = big
		errs := make([]error, len(batches))
		var wg sync.WaitGroup
		for i, evs := range batches {
			wg.Go(func() { errs[i] = p.Publish(t.Context(), evs) })
		}
		wg.Wait()
		for b, err := range errs {
			var pe *outbox.PublishError
			if err != nil && !errors.As(err, &pe) {
				t.Fatalf("round %d, call %d: Publish = %v", round, b, err)
			}
			for i, e := range batches[b] {
				var got error
				if pe != nil {
					got = pe.Errs[i]
				}
				switch {
				case e.ID == big.ID:
					if !errors.Is(got, outbox.ErrPoison) || !errors.Is(got, kerr.MessageTooLarge) {
						t.Errorf("round %d: the event too large for the topic: %v; want ErrPoison wrapping MESSAGE_TOO_LARGE", round, got)
					}
				case got != nil:
					t.Errorf("round %d, call %d: small event %d (key %s): %v; want published", round, b, i, e.Key, got)
				}
			}
		}
		if t.Failed() {
			return
		}
	}
}
