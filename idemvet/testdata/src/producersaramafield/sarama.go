package producersaramafield

import "github.com/IBM/sarama"

// A publisher whose config holds the sarama config in a field, filled with
// the package's default when the caller left it nil (watermill-kafka's
// PublisherConfig.OverwriteSaramaConfig): the default is reported where it
// is made.

type PublisherConfig struct {
	Brokers               []string
	OverwriteSaramaConfig *sarama.Config
}

func (c *PublisherConfig) setDefaults() {
	if c.OverwriteSaramaConfig == nil {
		c.OverwriteSaramaConfig = DefaultPublisherConfig()
	}
}

func DefaultPublisherConfig() *sarama.Config {
	config := sarama.NewConfig() // want "sarama producer without idempotence"
	config.Producer.Return.Successes = true
	return config
}

func NewPublisher(config PublisherConfig) (sarama.SyncProducer, error) {
	config.setDefaults()
	return sarama.NewSyncProducer(config.Brokers, config.OverwriteSaramaConfig)
}

// A field set in a struct literal, then given to the producer.
type publisher struct {
	cfg *sarama.Config
}

func newPublisher(addrs []string) (sarama.SyncProducer, error) {
	p := publisher{cfg: sarama.NewConfig()} // want "sarama producer without idempotence"
	return sarama.NewSyncProducer(addrs, p.cfg)
}

// A field the package never assigns: its config comes from elsewhere, not
// reported.
type external struct {
	Config *sarama.Config
}

func (e external) producer(addrs []string) (sarama.SyncProducer, error) {
	return sarama.NewSyncProducer(addrs, e.Config)
}

// A producer made from a client: the client's config is the producer's.
func fromClient(addrs []string) (sarama.SyncProducer, error) {
	cfg := sarama.NewConfig() // want "sarama producer without idempotence"
	cfg.Producer.Return.Successes = true
	client, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		return nil, err
	}
	return sarama.NewSyncProducerFromClient(client)
}

func asyncFromClient(addrs []string) {
	client, _ := sarama.NewClient(addrs, nil)
	sarama.NewAsyncProducerFromClient(client) // want "sarama producer without idempotence"
}

// A client from elsewhere: not reported.
func fromCallersClient(client sarama.Client) (sarama.SyncProducer, error) {
	return sarama.NewSyncProducerFromClient(client)
}
