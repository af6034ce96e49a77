package autocommit

import (
	"context"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A test's consumer group commits test offsets (a fake broker's group
// persistence, a handler under test): not reported.
func newTestGroup(addr string) (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("t"), kgo.ConsumerGroup("g"))
}

func readOne(ctx context.Context) (kafka.Message, error) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"k:9092"}, GroupID: "g", Topic: "t"})
	defer r.Close()
	return r.ReadMessage(ctx)
}
