// Package kafka is a stub of confluent-kafka-go for the idemvet tests.
package kafka

type ConfigValue any

type ConfigMap map[string]ConfigValue

func (m ConfigMap) SetKey(key string, value ConfigValue) error { m[key] = value; return nil }

type Producer struct{}

func NewProducer(conf *ConfigMap) (*Producer, error) { return &Producer{}, nil }

type Consumer struct{}

func NewConsumer(conf *ConfigMap) (*Consumer, error) { return &Consumer{}, nil }

type Message struct {
	Key, Value []byte
}

type Event any

func (*Consumer) Poll(timeoutMs int) Event                    { return nil }
func (*Consumer) ReadMessage(timeoutMs int) (*Message, error) { return nil, nil }

func (*Consumer) CommitMessage(m *Message) error { return nil }
func (*Consumer) StoreMessage(m *Message) error  { return nil }
