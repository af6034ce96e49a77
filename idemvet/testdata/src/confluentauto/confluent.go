package confluentauto

import "github.com/confluentinc/confluent-kafka-go/v2/kafka"

func consumer() {
	kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": "k:9092", "group.id": "billing"}) // want "confluent-kafka-go consumer group commits polled offsets on a timer"
}

// A ConfigMap made by a function of the package.
func consumerConfig(brokers, group string) *kafka.ConfigMap {
	return &kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": group, "auto.offset.reset": "earliest"}
}

func fromHelper() (*kafka.Consumer, error) {
	return kafka.NewConsumer(consumerConfig("k:9092", "billing")) // want "consumer group commits polled offsets on a timer"
}

// Not reported: settings copied in from elsewhere (a configuration file's
// librdkafka section) may turn the automatic commits off.
func withOverrides(overrides map[string]kafka.ConfigValue) {
	cfg := kafka.ConfigMap{"bootstrap.servers": "k:9092", "group.id": "billing"}
	for k, v := range overrides {
		cfg[k] = v
	}
	kafka.NewConsumer(&cfg)
}

func withOverridesSetKey(overrides map[string]string) {
	cfg := consumerConfig("k:9092", "billing")
	for k, v := range overrides {
		cfg.SetKey(k, v)
	}
	kafka.NewConsumer(cfg)
}
