package confluentauto

import "github.com/confluentinc/confluent-kafka-go/v2/kafka"

func consumer() {
	kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": "k:9092", "group.id": "billing"}) // want "confluent-kafka-go consumer group commits polled offsets on a timer"
}
