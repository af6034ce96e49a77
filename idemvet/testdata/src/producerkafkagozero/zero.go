// Package producerkafkagozero makes kafka-go Writers without a composite
// literal: new(kafka.Writer), var w kafka.Writer and a struct field of type
// kafka.Writer. Their RequiredAcks is the zero value, RequireNone: the
// writer waits for no acknowledgement.
package producerkafkagozero

import (
	"context"

	"github.com/segmentio/kafka-go"
)

func newWriter() *kafka.Writer {
	w := new(kafka.Writer) // want "kafka-go Writer without RequiredAcks"
	w.Addr = "k:9092"
	w.Topic = "orders"
	return w
}

func localVar(ctx context.Context, msg kafka.Message) error {
	var w kafka.Writer // want "kafka-go Writer without RequiredAcks"
	w.Addr = "k:9092"
	return w.WriteMessages(ctx, msg)
}

var audit kafka.Writer // want "kafka-go Writer without RequiredAcks"

func init() {
	audit.Addr = "k:9092"
	audit.Topic = "audit"
}

type publisher struct {
	w kafka.Writer // want "kafka-go Writer without RequiredAcks"
}

func (p *publisher) publish(ctx context.Context, msg kafka.Message) error {
	p.w.Addr = "k:9092"
	return p.w.WriteMessages(ctx, msg)
}

// Acks below all assigned afterwards: one report, at the assignment.

func newThenOne() *kafka.Writer {
	w := new(kafka.Writer)
	w.RequiredAcks = kafka.RequireOne // want "kafka-go Writer without RequiredAcks"
	return w
}

func varThenNone(ctx context.Context, msg kafka.Message) error {
	var w kafka.Writer
	w.RequiredAcks = kafka.RequireNone // want "kafka-go Writer without RequiredAcks"
	return w.WriteMessages(ctx, msg)
}

type sink struct {
	w kafka.Writer
}

func (s *sink) send(ctx context.Context, msg kafka.Message) error {
	s.w.RequiredAcks = kafka.RequireOne // want "kafka-go Writer without RequiredAcks"
	return s.w.WriteMessages(ctx, msg)
}

// Not reported: no Writer is made here.

// A nil pointer, assigned a writer made elsewhere.
var shared *kafka.Writer

func setShared(w *kafka.Writer) { shared = w }

func localPointer(ctx context.Context, mk func() *kafka.Writer, msg kafka.Message) error {
	var w *kafka.Writer
	w = mk()
	return w.WriteMessages(ctx, msg)
}

// A variable assigned a Writer from elsewhere after its declaration: what
// it holds is not a zero Writer.
func copied(from *kafka.Writer) kafka.Writer {
	var w kafka.Writer
	w = *from
	return w
}

// A field of type kafka.Writer that nothing writes through.
type unused struct {
	w kafka.Writer
}

// A field the package assigns a Writer made elsewhere.
type filled struct {
	w kafka.Writer
}

func (f *filled) set(w *kafka.Writer) { f.w = *w }

func (f *filled) publish(ctx context.Context, msg kafka.Message) error {
	return f.w.WriteMessages(ctx, msg)
}

// An exported field outside package main: its user may set RequiredAcks.
type Publisher struct {
	W kafka.Writer
}

func (p *Publisher) Publish(ctx context.Context, msg kafka.Message) error {
	return p.W.WriteMessages(ctx, msg)
}

// A pointer field: nil until the package or its user puts a writer there.
type pointerField struct {
	w *kafka.Writer
}

func (p *pointerField) publish(ctx context.Context, msg kafka.Message) error {
	return p.w.WriteMessages(ctx, msg)
}
