package idemkafka_test

import (
	"bytes"
	"database/sql"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

const ceSource = "/idem-test"

// Events published with each header format, to one topic, come out of the
// publisher with exactly the headers of their format, and come out of the
// consumer (which needs no setting) as the envelopes that went in.
func TestCloudEventsRoundTrip(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testCloudEventsRoundTrip[pgx.Tx], testCloudEventsRoundTrip[*sql.Tx])
}

func testCloudEventsRoundTrip[TTx any](t *testing.T, b *backend[TTx]) {
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 3)
	group := kafkatest.Name("g")

	formats := []event.HeaderFormat{event.HeaderFormatCloudEvents, event.HeaderFormatBoth, event.HeaderFormatIdem}
	evs := newEvents(t, 3*len(formats), 4)
	formatOf := map[uuid.UUID]event.HeaderFormat{}
	for i := range evs {
		e := &evs[i]
		e.OccurredAt = time.Date(2025, 3, 4, 5, 6, 7, 890123000+i*1000, time.UTC)
		switch i % 3 {
		case 1:
			e.SagaID = "saga-" + e.Key
		case 2:
			e.SagaID = "saga-x"
			e.Headers = map[string]string{"traceparent": "00-abc-def-01", "tenant": "t1"}
		}
		formatOf[e.ID] = formats[i/3]
	}
	for i, f := range formats {
		p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, HeaderFormat: f, Source: ceSource})
		if err := p.Publish(t.Context(), evs[3*i:3*i+3]); err != nil {
			t.Fatalf("Publish %s: %v", f, err)
		}
	}

	// The raw records: the key is the aggregate key, the value the payload,
	// the headers exactly those of the format.
	byID := map[uuid.UUID]event.Envelope{}
	for _, e := range evs {
		byID[e.ID] = e
	}
	rs := kc.Records(t, topic)
	if len(rs) != len(evs) {
		t.Fatalf("topic holds %d records; want %d", len(rs), len(evs))
	}
	for _, r := range rs {
		id := header(r, event.HeaderCEID)
		if id == "" {
			id = header(r, event.HeaderEventID)
		}
		e, ok := byID[uuid.MustParse(id)]
		if !ok {
			t.Fatalf("record of unknown event %s", id)
		}
		if string(r.Key) != e.Key || !bytes.Equal(r.Value, e.Payload) {
			t.Errorf("record of %s: key %q value %q; want %q %q", e.ID, r.Key, r.Value, e.Key, e.Payload)
		}
		want := wantHeaders(e, formatOf[e.ID])
		if got := r.Headers; !slices.EqualFunc(got, want, func(a, b kgo.RecordHeader) bool { return a.Key == b.Key && bytes.Equal(a.Value, b.Value) }) {
			t.Errorf("%s record of %s: headers\n%q\nwant\n%q", formatOf[e.ID], e.ID, got, want)
		}
	}

	// Through the consumer and its inbox.
	var (
		mu  sync.Mutex
		got = map[uuid.UUID]event.Envelope{}
	)
	hook := func(e event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		got[e.ID] = e
		return nil
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic))
	waitFor(t, 30*time.Second, "the topic consumed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
	if s := inst.stats.get(); s.dead != 0 {
		t.Fatalf("%d records dead-lettered", s.dead)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, want := range evs {
		e, ok := got[want.ID]
		switch {
		case !ok:
			t.Errorf("%s event %s never reached the handler", formatOf[want.ID], want.ID)
		case e.Type != want.Type || e.Key != want.Key || e.SagaID != want.SagaID || !e.OccurredAt.Equal(want.OccurredAt) ||
			e.OccurredAt.Location() != time.UTC || !bytes.Equal(e.Payload, want.Payload) || !maps.Equal(e.Headers, want.Headers):
			t.Errorf("%s event came back as\n%+v\nwant\n%+v", formatOf[want.ID], e, want)
		}
	}
}

// wantHeaders spells out the headers of e in format f.
func wantHeaders(e event.Envelope, f event.HeaderFormat) []kgo.RecordHeader {
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	at := e.OccurredAt.UTC().Format(time.RFC3339Nano)
	var idem, ce, extra []kgo.RecordHeader
	idem = append(idem, h("idem-event-id", e.ID.String()), h("idem-event-type", e.Type))
	if e.SagaID != "" {
		idem = append(idem, h("idem-saga-id", e.SagaID))
	}
	idem = append(idem, h("idem-occurred-at", at))
	ce = append(ce,
		h("ce_specversion", "1.0"),
		h("ce_id", e.ID.String()),
		h("ce_source", ceSource),
		h("ce_type", e.Type),
		h("ce_subject", e.Key),
		h("ce_time", at),
		h("ce_partitionkey", e.Key),
	)
	if e.SagaID != "" {
		ce = append(ce, h("ce_idemsagaid", e.SagaID))
	}
	ce = append(ce, h("content-type", "application/json"))
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		extra = append(extra, h(k, e.Headers[k]))
	}
	switch f {
	case event.HeaderFormatCloudEvents:
		return slices.Concat(ce, extra)
	case event.HeaderFormatBoth:
		return slices.Concat(idem, ce, extra)
	default:
		return slices.Concat(idem, extra)
	}
}

func TestRecordWith(t *testing.T) {
	t.Parallel()
	e := newEvents(t, 1, 1)[0]
	e.SagaID = "saga-7"
	for _, f := range []event.HeaderFormat{event.HeaderFormatIdem, event.HeaderFormatCloudEvents, event.HeaderFormatBoth} {
		r, err := idemkafka.RecordWith("orders", e, event.HeaderOptions{Format: f, Source: ceSource})
		if err != nil {
			t.Fatalf("%s: RecordWith: %v", f, err)
		}
		if r.Topic != "orders" || string(r.Key) != e.Key || !bytes.Equal(r.Value, e.Payload) {
			t.Fatalf("%s: RecordWith = topic %q key %q value %q", f, r.Topic, r.Key, r.Value)
		}
		back, err := idemkafka.Envelope(r)
		if err != nil {
			t.Fatalf("%s: Envelope: %v", f, err)
		}
		if back.ID != e.ID || back.Type != e.Type || back.Key != e.Key || back.SagaID != e.SagaID || !back.OccurredAt.Equal(e.OccurredAt) {
			t.Fatalf("%s: Envelope(RecordWith(e)) = %+v; want %+v", f, back, e)
		}
	}
	if _, err := idemkafka.RecordWith("orders", e, event.HeaderOptions{Format: event.HeaderFormatCloudEvents}); err == nil {
		t.Error("RecordWith without a Source: no error")
	}
}

// With a CloudEvents format, an event with a "ce_" extra header is poison:
// it is refused before anything is sent (so no broker is needed), and the
// other events of its key are skipped.
func TestPublishCloudEventsReservedHeader(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: []string{"127.0.0.1:1"}, DefaultTopic: "orders", HeaderFormat: event.HeaderFormatCloudEvents, Source: ceSource})
	evs := newEvents(t, 2, 1)
	evs[0].Headers = map[string]string{"ce_traceparent": "00-1"}
	err := p.Publish(t.Context(), evs)
	var pe *outbox.PublishError
	if !errors.As(err, &pe) || len(pe.Errs) != 2 {
		t.Fatalf("Publish = %v; want a PublishError for 2 events", err)
	}
	if !errors.Is(pe.Errs[0], outbox.ErrPoison) || !errors.Is(pe.Errs[0], event.ErrReservedHeader) {
		t.Errorf("event 0: %v; want ErrPoison and ErrReservedHeader", pe.Errs[0])
	}
	if !errors.Is(pe.Errs[1], outbox.ErrSkipped) {
		t.Errorf("event 1: %v; want ErrSkipped", pe.Errs[1])
	}
}
