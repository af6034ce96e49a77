// Package producerkafkagoset builds kafka-go Writers and sets RequiredAcks
// after the literal.
package producerkafkagoset

import "github.com/segmentio/kafka-go"

// Not reported: the literal leaves RequiredAcks out, the assignment that
// follows sets it to all.

func literalThenAll() *kafka.Writer {
	w := &kafka.Writer{Addr: "k:9092", Topic: "orders"}
	w.RequiredAcks = kafka.RequireAll
	return w
}

type producer struct {
	w *kafka.Writer
}

func newProducer(exactlyOnce bool) *producer {
	p := &producer{w: &kafka.Writer{Addr: "k:9092"}}
	p.w.Topic = "orders"
	p.w.RequiredAcks = kafka.RequireAll
	return p
}

func empty() *kafka.Writer {
	w := &kafka.Writer{}
	w.Addr = "k:9092"
	w.RequiredAcks = kafka.RequireAll
	return w
}

// Reported: acks below all, set after the literal.

func literalThenNone() *kafka.Writer {
	w := &kafka.Writer{Addr: "k:9092"}
	w.RequiredAcks = kafka.RequireNone // want "kafka-go Writer without RequiredAcks"
	return w
}
