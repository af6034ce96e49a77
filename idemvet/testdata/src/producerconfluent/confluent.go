package producerconfluent

import "github.com/confluentinc/confluent-kafka-go/v2/kafka"

func defaults() {
	kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": "k:9092"}) // want "confluent-kafka-go producer without enable.idempotence"
}

func variable() {
	cfg := kafka.ConfigMap{"bootstrap.servers": "k:9092", "linger.ms": 5}
	kafka.NewProducer(&cfg) // want "confluent-kafka-go producer without enable.idempotence"
}

func lowAcks() {
	cfg := &kafka.ConfigMap{"bootstrap.servers": "k:9092"}
	cfg.SetKey("acks", 1)                 // want "confluent-kafka-go producer with acks below all"
	(*cfg)["request.required.acks"] = "0" // want "confluent-kafka-go producer with acks below all"
}

func off() {
	kafka.NewConsumer(&kafka.ConfigMap{"enable.idempotence": false}) // want "confluent-kafka-go producer with enable.idempotence off"
}

// Not reported: a map from the caller.

func fromCaller(cfg *kafka.ConfigMap) {
	kafka.NewProducer(cfg)
}

func producerConfig(brokers string) *kafka.ConfigMap {
	cfg := kafka.ConfigMap{"bootstrap.servers": brokers, "acks": "all"}
	return &cfg
}

func fromHelper() {
	kafka.NewProducer(producerConfig("k:9092")) // want "confluent-kafka-go producer without enable.idempotence"
}

func withOverrides(overrides map[string]kafka.ConfigValue) {
	cfg := producerConfig("k:9092")
	for k, v := range overrides {
		(*cfg)[k] = v
	}
	kafka.NewProducer(cfg)
}
