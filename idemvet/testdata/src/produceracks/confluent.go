package produceracks

import "github.com/confluentinc/confluent-kafka-go/v2/kafka"

const confluentAcks = "1"

var confluentNoAcks = 0

func confluentConst() kafka.ConfigMap {
	return kafka.ConfigMap{"bootstrap.servers": "k:9092", "enable.idempotence": true, "acks": confluentAcks} // want "confluent-kafka-go producer with acks below all"
}

func confluentVar(cfg *kafka.ConfigMap) {
	cfg.SetKey("acks", confluentNoAcks) // want "confluent-kafka-go producer with acks below all"
}

// Not reported.

var confluentAll = "all"

func confluentAllVar(cfg *kafka.ConfigMap) {
	cfg.SetKey("acks", confluentAll)
}
