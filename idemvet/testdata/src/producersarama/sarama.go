package producersarama

import "github.com/IBM/sarama"

// A producer config with sarama's defaults, made in a helper: reported
// where it is made.
func producerConfig() *sarama.Config {
	cfg := sarama.NewConfig() // want "sarama producer without idempotence"
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	return cfg
}

func newProducer(addrs []string) (sarama.SyncProducer, error) {
	cfg := producerConfig()
	return sarama.NewSyncProducer(addrs, cfg)
}

func inline(addrs []string) {
	sarama.NewAsyncProducer(addrs, sarama.NewConfig()) // want "sarama producer without idempotence"
}

func nilConfig(addrs []string) {
	sarama.NewSyncProducer(addrs, nil) // want "sarama producer without idempotence"
}

func leaderAcks(cfg *sarama.Config) {
	cfg.Producer.RequiredAcks = sarama.WaitForLocal // want "sarama producer with acks below all"
}

func disabled(cfg *sarama.Config) {
	cfg.Producer.Idempotent = false // want "sarama producer with idempotence disabled"
}

// Not reported: a config from elsewhere, a consumer's config.

func fromCaller(addrs []string, cfg *sarama.Config) {
	sarama.NewSyncProducer(addrs, cfg)
}

func consumer(addrs []string) {
	cfg := sarama.NewConfig()
	cfg.Consumer.Return.Errors = true
	sarama.NewConsumerGroup(addrs, "billing", cfg)
}
