// Package sarama is a stub of IBM/sarama for the idemvet tests.
package sarama

import "context"

type RequiredAcks int16

const (
	NoResponse   RequiredAcks = 0
	WaitForLocal RequiredAcks = 1
	WaitForAll   RequiredAcks = -1
)

type Config struct {
	Net struct {
		MaxOpenRequests int
	}
	Producer struct {
		RequiredAcks RequiredAcks
		Idempotent   bool
		Return       struct {
			Successes bool
		}
	}
	Consumer struct {
		Return struct {
			Errors bool
		}
	}
}

// NewConfig sets sarama's defaults, acks from the leader only among them,
// as the real one does: the client's own package is not checked.
func NewConfig() *Config {
	c := &Config{}
	c.Producer.RequiredAcks = WaitForLocal
	return c
}

// NewSyncProducerFromDefaults makes a producer with sarama's defaults, in
// the client's own package: not reported either.
func NewSyncProducerFromDefaults(addrs []string) (SyncProducer, error) {
	return NewSyncProducer(addrs, NewConfig())
}

type SyncProducer interface {
	SendMessage(msg *ProducerMessage) (partition int32, offset int64, err error)
	Close() error
}
type AsyncProducer interface{ Close() error }
type ConsumerGroup interface{ Close() error }

func NewSyncProducer(addrs []string, config *Config) (SyncProducer, error)   { return nil, nil }
func NewAsyncProducer(addrs []string, config *Config) (AsyncProducer, error) { return nil, nil }

type Client interface{ Close() error }

func NewClient(addrs []string, config *Config) (Client, error)        { return nil, nil }
func NewSyncProducerFromClient(client Client) (SyncProducer, error)   { return nil, nil }
func NewAsyncProducerFromClient(client Client) (AsyncProducer, error) { return nil, nil }
func NewConsumerGroup(addrs []string, groupID string, config *Config) (ConsumerGroup, error) {
	return nil, nil
}

type ConsumerMessage struct {
	Key, Value []byte
	Topic      string
	Partition  int32
	Offset     int64
}

type ConsumerGroupSession interface {
	Context() context.Context
	MarkMessage(msg *ConsumerMessage, metadata string)
	MarkOffset(topic string, partition int32, offset int64, metadata string)
	Commit()
}

type ConsumerGroupClaim interface {
	Topic() string
	Messages() <-chan *ConsumerMessage
}

type PartitionConsumer interface {
	Messages() <-chan *ConsumerMessage
}

type ProducerMessage struct {
	Topic string
	Key   Encoder
	Value Encoder
}

type Encoder interface{ Encode() ([]byte, error) }

type ByteEncoder []byte

func (b ByteEncoder) Encode() ([]byte, error) { return b, nil }
