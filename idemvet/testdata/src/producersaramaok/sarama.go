package producersaramaok

import "github.com/IBM/sarama"

// Idempotence set where the config is made; the producer is created in
// another function.
func producerConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Net.MaxOpenRequests = 1
	return cfg
}

func newProducer(addrs []string) (sarama.SyncProducer, error) {
	return sarama.NewSyncProducer(addrs, producerConfig())
}
