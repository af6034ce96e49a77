package idemkafka_test

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// What README's Kafka section and PublisherConfig.DefaultTopic say: a
// cluster that creates topics on demand creates a missing topic only for a
// client that asks (kgo.AllowAutoTopicCreation in ExtraOpts). Without it the
// publish fails with UNKNOWN_TOPIC_OR_PARTITION (the events wait in the
// outbox); with it the events are published. An adopter who started kfake
// with AllowAutoTopicCreation saw the relay fail for ever.
func TestPublishMissingTopicAutoCreation(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t, kfake.AllowAutoTopicCreation())
	kc.Fake(t) // the cluster's auto-creation is kfake's option here

	topic := kafkatest.Name("autotopic")
	evs := newEvents(t, 3, 3)
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, ExtraOpts: []kgo.Opt{fastRetry}})
	err := p.Publish(t.Context(), evs)
	if !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("Publish without kgo.AllowAutoTopicCreation: %v; want UNKNOWN_TOPIC_OR_PARTITION", err)
	}

	p = newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic,
		ExtraOpts: []kgo.Opt{fastRetry, kgo.AllowAutoTopicCreation()}})
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatalf("Publish with kgo.AllowAutoTopicCreation: %v", err)
	}
	mustPublished(t, kc.Records(t, topic), evs)
}
