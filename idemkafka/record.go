package idemkafka

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
)

// Record returns the Kafka record of e for topic: key e.Key, value
// e.Payload, and headers e.RecordHeaders() (the event ID, type, saga ID and
// occurrence time, then e's extra headers). The record is fresh: the caller
// may hand it to a kgo client, which takes ownership.
func Record(topic string, e event.Envelope) *kgo.Record {
	return newRecord(topic, e, e.RecordHeaders())
}

// RecordWith is Record with the headers that o selects (see
// event.Envelope.RecordHeadersWith): idem's own, the CloudEvents Kafka
// binding's binary-mode headers, or both. The key is e.Key in every format.
// It fails if o is not valid, or if o writes CloudEvents headers and e has
// an extra header whose name starts with "ce_" (event.ErrReservedHeader).
func RecordWith(topic string, e event.Envelope, o event.HeaderOptions) (*kgo.Record, error) {
	hs, err := e.RecordHeadersWith(o)
	if err != nil {
		return nil, err
	}
	return newRecord(topic, e, hs), nil
}

func newRecord(topic string, e event.Envelope, hs []event.Header) *kgo.Record {
	rh := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		rh[i] = kgo.RecordHeader(h)
	}
	return &kgo.Record{Topic: topic, Key: e.RecordKey(), Value: e.Payload, Headers: rh}
}

// Envelope decodes a record written by Record or RecordWith, in any header
// format, or by any producer that follows event.FromRecord's header mapping
// (a CloudEvents producer in binary mode included). A record that is not a
// valid idem event returns an *event.DecodeError: retrying cannot fix it,
// so the consumer dead-letters it at once.
func Envelope(r *kgo.Record) (event.Envelope, error) {
	// FromRecord keeps nothing of hs: the usual handful of headers is
	// converted on the stack, not in a slice allocated per record.
	var buf [16]event.Header
	hs := buf[:0]
	if len(r.Headers) > len(buf) {
		hs = make([]event.Header, 0, len(r.Headers))
	}
	for _, h := range r.Headers {
		hs = append(hs, event.Header(h))
	}
	return event.FromRecord(r.Key, r.Value, hs)
}
