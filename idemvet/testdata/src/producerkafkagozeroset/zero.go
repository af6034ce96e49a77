// Package producerkafkagozeroset makes kafka-go Writers without a composite
// literal and sets their RequiredAcks to all.
package producerkafkagozeroset

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// Not reported: the package assigns a Writer's RequiredAcks (to all).

func newWriter() *kafka.Writer {
	w := new(kafka.Writer)
	w.Addr = "k:9092"
	w.RequiredAcks = kafka.RequireAll
	return w
}

func localVar(ctx context.Context, msg kafka.Message) error {
	var w kafka.Writer
	w.Addr = "k:9092"
	w.RequiredAcks = kafka.RequireAll
	return w.WriteMessages(ctx, msg)
}

type publisher struct {
	w kafka.Writer
}

func (p *publisher) publish(ctx context.Context, msg kafka.Message) error {
	p.w.RequiredAcks = kafka.RequireAll
	return p.w.WriteMessages(ctx, msg)
}
