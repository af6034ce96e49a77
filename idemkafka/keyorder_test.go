package idemkafka_test

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
)

// A partitioner that spreads a key's records over partitions (round robin,
// sticky, least backup, uniform bytes without keys) breaks the order of a
// key's events from the outbox to the topic: NewPublisher refuses it. The
// key-hashing partitioners, and a manual one (every record to the
// partition it names), keep a key in one partition and pass.
func TestPublisherRejectsKeylessPartitioner(t *testing.T) {
	t.Parallel()
	seeds := []string{"127.0.0.1:1"} // never dialled: construction does no I/O
	for name, p := range map[string]kgo.Partitioner{
		"RoundRobinPartitioner":               kgo.RoundRobinPartitioner(),
		"StickyPartitioner":                   kgo.StickyPartitioner(),
		"LeastBackupPartitioner":              kgo.LeastBackupPartitioner(),
		"UniformBytesPartitioner(keys=false)": kgo.UniformBytesPartitioner(64<<10, true, false, nil),
	} {
		t.Run(name, func(t *testing.T) {
			opts := []kgo.Opt{kgo.RecordPartitioner(p)}
			_, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders", ExtraOpts: opts})
			if !errors.Is(err, idemkafka.ErrUnsupportedOption) {
				t.Fatalf("NewPublisher = %v; want ErrUnsupportedOption", err)
			}
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if _, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Client: cl, DefaultTopic: "orders"}); !errors.Is(err, idemkafka.ErrUnsupportedOption) {
				t.Fatalf("NewPublisher with the client = %v; want ErrUnsupportedOption", err)
			}
		})
	}
	for name, p := range map[string]kgo.Partitioner{
		"StickyKeyPartitioner":    kgo.StickyKeyPartitioner(nil),
		"UniformBytesPartitioner": kgo.UniformBytesPartitioner(1<<20, false, true, nil),
		"ManualPartitioner":       kgo.ManualPartitioner(),
	} {
		p, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders", ExtraOpts: []kgo.Opt{kgo.RecordPartitioner(p)}})
		if err != nil {
			t.Errorf("NewPublisher with %s: %v", name, err)
			continue
		}
		p.Close()
	}
}
