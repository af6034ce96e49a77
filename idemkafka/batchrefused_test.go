package idemkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// A topic whose max.message.bytes (64 KiB) is below kgo's batch size: 40
// small events (4 KiB each, every one of which fits) are batched together
// and the broker refuses the batch; none of them is poison (all 40 were
// parked before), each is published alone.
func TestSmallEventsOfARefusedBatchNotPoison(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kafkatest.Name("orders")
	kc.CreateTopicConfig(t, topic, 1, map[string]string{"max.message.bytes": "65536"})
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, ExtraOpts: []kgo.Opt{kgo.ProducerLinger(50 * time.Millisecond)}})
	evs := make([]event.Envelope, 40)
	for i := range evs {
		e, err := event.New("OrderCreated.v1", fmt.Sprintf("order-%d", i), map[string]string{"pad": hex.EncodeToString(randomBytes(2000))})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = e
	}
	err := p.Publish(context.Background(), evs)
	var pe *outbox.PublishError
	if errors.As(err, &pe) {
		poison := 0
		for _, e := range pe.Errs {
			if errors.Is(e, outbox.ErrPoison) {
				poison++
			}
		}
		t.Fatalf("%d of %d small events classified poison (first: %v)", poison, len(evs), pe.Errs[0])
	}
	if err != nil {
		t.Fatal(err)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}
