package confluentmanual

import "github.com/confluentinc/confluent-kafka-go/v2/kafka"

func consumer() {
	kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": "k:9092", "group.id": "billing", "enable.auto.offset.store": false})
}

func plain() {
	cfg := kafka.ConfigMap{"bootstrap.servers": "k:9092", "group.id": "billing"}
	cfg["enable.auto.commit"] = "false"
	kafka.NewConsumer(&cfg)
}
