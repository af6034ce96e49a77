package idemkafka_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// A Publish whose ctx ends (the relay's PublishTimeout) while kgo's buffer
// is full fails the record waiting for room; kgo still buffered, and sent,
// the key's next record when it fit. The later event was published and the
// earlier one retried after it. Once ctx is done, no further record of the
// call is produced.
func TestPublishCancelKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	if kc.Real() {
		t.Skip("holds a produce request in kfake")
	}
	topic := kc.Topic(t, "orders", 1)
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic,
		ExtraOpts: []kgo.Opt{kgo.MaxBufferedBytes(20 << 10)}})
	// Warm up: metadata and producer ID.
	if err := p.Publish(t.Context(), newEvents(t, 1, 1)); err != nil {
		t.Fatal(err)
	}
	warm := len(kc.Records(t, topic))

	release := make(chan struct{})
	fake := kc.Fake(t)
	fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		fake.SleepControl(func() { <-release })
		return nil, nil, false
	})
	// One key: event 0 goes out and the broker holds it; event 1 does
	// not fit the client's buffer beside it and waits until ctx ends;
	// event 2 fits.
	evs := newEvents(t, 3, 1)
	for i, n := range []int{8 << 10, 16 << 10} {
		e, err := event.New("OrderCreated.v1", evs[i].Key, map[string]string{"pad": strings.Repeat("x", n)})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = e
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	go func() { <-ctx.Done(); time.Sleep(100 * time.Millisecond); close(release) }()
	err := p.Publish(ctx, evs)
	var pe *outbox.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish = %v; want a PublishError", err)
	}
	t.Logf("errs: %v", pe.Errs)
	if pe.Errs[1] == nil {
		t.Fatalf("event 1 published; the test wants it to fail on ctx")
	}
	if pe.Errs[2] == nil {
		t.Errorf("event 2 published although event 1 of its key failed: %v", pe.Errs[1])
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(kc.Records(t, topic)) - warm; n > 1 {
		t.Errorf("%d records appended; want at most event 0", n)
	}
}
