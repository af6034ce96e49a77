package producerkafkago

import "github.com/segmentio/kafka-go"

func defaults() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", Topic: "orders"} // want "kafka-go Writer without RequiredAcks"
}

func leaderOnly() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: kafka.RequireOne} // want "kafka-go Writer without RequiredAcks"
}

func assigned(w *kafka.Writer) {
	w.RequiredAcks = kafka.RequireNone // want "kafka-go Writer without RequiredAcks"
}

// Not reported.

func all() *kafka.Writer {
	return &kafka.Writer{Addr: "k:9092", RequiredAcks: kafka.RequireAll}
}
