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

// UnmarshalText sets acks from its name ("none", "one", "all") or number.
func (acks *RequiredAcks) UnmarshalText(b []byte) error {
	switch string(b) {
	case "none", "0":
		*acks = RequireNone
	case "one", "1":
		*acks = RequireOne
	default:
		*acks = RequireAll
	}
	return nil
}

type Writer struct {
	Addr         string
	Topic        string
	RequiredAcks RequiredAcks
}

func (*Writer) WriteMessages(ctx context.Context, msgs ...Message) error { return nil }

// WriterConfig is the configuration of NewWriter, kafka-go's older (and
// deprecated) constructor. RequiredAcks is an int: -1 all, 1 the leader;
// NewWriter turns 0 (the zero value) into RequireAll.
type WriterConfig struct {
	Brokers      []string
	Topic        string
	RequiredAcks int
	Async        bool
}

func NewWriter(config WriterConfig) *Writer {
	w := &Writer{Topic: config.Topic, RequiredAcks: RequiredAcks(config.RequiredAcks)}
	if config.RequiredAcks == 0 {
		w.RequiredAcks = RequireAll
	}
	return w
}
