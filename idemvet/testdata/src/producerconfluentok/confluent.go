package producerconfluentok

import "github.com/confluentinc/confluent-kafka-go/v2/kafka"

func newProducer() {
	kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": "k:9092", "enable.idempotence": true, "acks": "all"})
}

func setLater() {
	cfg := kafka.ConfigMap{"bootstrap.servers": "k:9092"}
	cfg.SetKey("enable.idempotence", "true")
	kafka.NewProducer(&cfg)
}
