// Package main keeps a kafka-go Writer in an exported field: no other
// package can set it, so the zero Writer is reported.
package main

import (
	"context"

	"github.com/segmentio/kafka-go"
)

type Publisher struct {
	Writer kafka.Writer // want "kafka-go Writer without RequiredAcks"
}

func (p *Publisher) Publish(ctx context.Context, msg kafka.Message) error {
	return p.Writer.WriteMessages(ctx, msg)
}

func main() {
	p := &Publisher{}
	p.Writer.Addr = "k:9092"
	_ = p.Publish(context.Background(), kafka.Message{})
}
