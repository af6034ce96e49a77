// Package kafka is a stub of segmentio/kafka-go for the idemvet tests.
package kafka

import "context"

type Message struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
}

type ReaderConfig struct {
	Brokers   []string
	GroupID   string
	Topic     string
	Partition int
}

type Reader struct{}

func NewReader(config ReaderConfig) *Reader { return &Reader{} }

func (*Reader) ReadMessage(ctx context.Context) (Message, error)          { return Message{}, nil }
func (*Reader) FetchMessage(ctx context.Context) (Message, error)         { return Message{}, nil }
func (*Reader) CommitMessages(ctx context.Context, msgs ...Message) error { return nil }
func (*Reader) Close() error                                              { return nil }

type RequiredAcks int

const (
	RequireNone RequiredAcks = 0
	RequireOne  RequiredAcks = 1
	RequireAll  RequiredAcks = -1
)

type Writer struct {
	Addr         string
	Topic        string
	RequiredAcks RequiredAcks
}

func (*Writer) WriteMessages(ctx context.Context, msgs ...Message) error { return nil }
