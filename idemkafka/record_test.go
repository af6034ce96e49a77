package idemkafka_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
)

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEvents(t, 1, 1)[0]
	e.SagaID = "saga-7"
	e.Headers = map[string]string{"tenant": "t1", "traceparent": "00-1-01"}
	r := idemkafka.Record("orders", e)
	if r.Topic != "orders" || string(r.Key) != e.Key || !bytes.Equal(r.Value, e.Payload) {
		t.Fatalf("Record = topic %q key %q value %q", r.Topic, r.Key, r.Value)
	}
	if got := header(r, event.HeaderEventID); got != e.ID.String() {
		t.Fatalf("%s header = %q; want %s", event.HeaderEventID, got, e.ID)
	}
	back, err := idemkafka.Envelope(r)
	if err != nil {
		t.Fatalf("Envelope: %v", err)
	}
	if back.ID != e.ID || back.Type != e.Type || back.Key != e.Key || back.SagaID != e.SagaID ||
		!back.OccurredAt.Equal(e.OccurredAt) || !bytes.Equal(back.Payload, e.Payload) ||
		back.Headers["tenant"] != "t1" || back.Headers["traceparent"] != "00-1-01" || len(back.Headers) != 2 {
		t.Fatalf("Envelope(Record(e)) = %+v; want %+v", back, e)
	}

	var de *event.DecodeError
	if _, err := idemkafka.Envelope(&kgo.Record{Key: []byte("k"), Value: []byte("{}")}); !errors.As(err, &de) || !errors.Is(err, event.ErrMissingHeader) {
		t.Fatalf("Envelope of a record without headers = %v; want a *event.DecodeError wrapping ErrMissingHeader", err)
	}
}
