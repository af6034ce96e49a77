package idemkafka_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// kgo fails a record too large for its own limits (MaxBufferedBytes, or a
// batch once the record's framing is counted: many headers) at once and
// alone, and goes on producing the later records of its partition. The
// publisher's size check missed those limits: the poison event was parked
// while the next event of its key was already published, ahead of it.
// Such an event is now poison before anything is produced, and the key's
// later events are skipped.
func TestPublishClientLimitKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)

	headers := map[string]string{}
	for i := range 1000 {
		headers[fmt.Sprintf("h%03d", i)] = ""
	}
	const batchMax = 64 << 10
	for name, tc := range map[string]struct {
		opts []kgo.Opt
		big  func(key string) event.Envelope
	}{
		"MaxBufferedBytes": {
			opts: []kgo.Opt{kgo.MaxBufferedBytes(32 << 10)},
			big: func(key string) event.Envelope {
				e, err := event.New("OrderCreated.v1", key, map[string]string{"pad": strings.Repeat("x", 40<<10)})
				if err != nil {
					t.Fatal(err)
				}
				return e
			},
		},
		"header framing": {
			opts: []kgo.Opt{kgo.ProducerBatchMaxBytes(batchMax)},
			big: func(key string) event.Envelope {
				e, err := event.New("OrderCreated.v1", key, map[string]string{"pad": ""})
				if err != nil {
					t.Fatal(err)
				}
				e.Headers = headers
				size := len(e.Key) + len(e.Payload)
				for _, h := range idemkafka.Record("t", e).Headers {
					size += len(h.Key) + len(h.Value)
				}
				// Just within the publisher's old allowance of 1 KiB for
				// the framing; the framing of 1000 headers is 2 KiB more.
				e, err = event.New("OrderCreated.v1", key, map[string]string{"pad": strings.Repeat("x", batchMax-1024-size)})
				if err != nil {
					t.Fatal(err)
				}
				e.Headers = headers
				return e
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			topic := kc.Topic(t, "orders", 1)
			p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, ExtraOpts: tc.opts})
			evs := newEvents(t, 3, 1) // one key
			evs[1] = tc.big(evs[0].Key)
			err := p.Publish(t.Context(), evs)
			var pe *outbox.PublishError
			if !errors.As(err, &pe) {
				t.Fatalf("Publish = %v; want a PublishError", err)
			}
			if pe.Errs[0] != nil {
				t.Errorf("event 0: %v; want published", pe.Errs[0])
			}
			if !errors.Is(pe.Errs[1], outbox.ErrPoison) || !errors.Is(pe.Errs[1], kerr.MessageTooLarge) {
				t.Errorf("event 1 (too large for the client): %v; want ErrPoison wrapping MESSAGE_TOO_LARGE", pe.Errs[1])
			}
			if !errors.Is(pe.Errs[2], outbox.ErrSkipped) {
				t.Errorf("event 2, after the poison of its key: %v; want ErrSkipped", pe.Errs[2])
			}
			mustPublished(t, kc.Records(t, topic), evs[:1])
		})
	}
}
