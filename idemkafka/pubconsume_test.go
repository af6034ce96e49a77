package idemkafka_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
)

// Consumer options in the publisher's ExtraOpts (a base option list shared
// with the consumer: TLS, SASL, the group) made the publisher's client join
// the consumers' group as soon as it was created: it was assigned
// partitions it never polled, and their records were never applied, while
// the group looked healthy. Without a group it fetched records into memory
// for nothing. NewPublisher refuses them in ExtraOpts (a client given in
// PublisherConfig.Client is the caller's to poll).
func TestPublisherRejectsConsumerOptions(t *testing.T) {
	t.Parallel()
	seeds := []string{"127.0.0.1:1"} // never dialled: construction does no I/O
	for name, opts := range map[string][]kgo.Opt{
		"ConsumerGroup and ConsumeTopics": {kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders")},
		"ConsumeTopics":                   {kgo.ConsumeTopics("orders")},
		"ConsumeRegex":                    {kgo.ConsumeTopics("orders.*"), kgo.ConsumeRegex()},
		"ConsumePartitions":               {kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"orders": {0: kgo.NewOffset()}})},
		// kgo refuses direct partitions in a group itself: its error was
		// returned, not ErrUnsupportedOption.
		"ConsumerGroup and ConsumePartitions": {kgo.ConsumerGroup("billing"), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"orders": {0: kgo.NewOffset()}})},
		"ShareGroup and ConsumePartitions":    {kgo.ShareGroup("billing"), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"orders": {0: kgo.NewOffset()}})},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders", ExtraOpts: opts})
			if err == nil {
				p.Close()
			}
			if !errors.Is(err, idemkafka.ErrUnsupportedOption) || !strings.Contains(err.Error(), "Consume") {
				t.Fatalf("NewPublisher = %v; want ErrUnsupportedOption naming the option", err)
			}
		})
	}
	// A share group with topics (KIP-932) would take records it never
	// acknowledges: the error named ConsumeTopics only, not the share group.
	p, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders", ExtraOpts: []kgo.Opt{kgo.ShareGroup("billing"), kgo.ConsumeTopics("orders")}})
	if err == nil {
		p.Close()
	}
	if !errors.Is(err, idemkafka.ErrUnsupportedOption) || !strings.Contains(err.Error(), "ShareGroup") {
		t.Fatalf("NewPublisher with ShareGroup and ConsumeTopics = %v; want ErrUnsupportedOption naming ShareGroup", err)
	}
	// A group without topics consumes nothing: allowed (a shared base).
	p, err = idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders", ExtraOpts: []kgo.Opt{kgo.ConsumerGroup("billing")}})
	if err != nil {
		t.Fatalf("NewPublisher with a group and no topics: %v", err)
	}
	p.Close()
}
