package event_test

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
)

func TestRecordHeaders(t *testing.T) {
	t.Parallel()
	e := validEnvelope(t)
	e.OccurredAt = time.Date(2025, 3, 4, 5, 6, 7, 890123000, time.FixedZone("CET", 3600))
	e.SagaID = "saga-7"
	e.Headers = map[string]string{"traceparent": "00-1", "b": "2", "a": "1"}

	got := e.RecordHeaders()
	want := []event.Header{
		{Key: event.HeaderEventID, Value: []byte(e.ID.String())},
		{Key: event.HeaderEventType, Value: []byte("OrderCreated.v1")},
		{Key: event.HeaderSagaID, Value: []byte("saga-7")},
		{Key: event.HeaderOccurredAt, Value: []byte("2025-03-04T04:06:07.890123Z")},
		{Key: "a", Value: []byte("1")},
		{Key: "b", Value: []byte("2")},
		{Key: "traceparent", Value: []byte("00-1")},
	}
	if !headersEqual(got, want) {
		t.Errorf("RecordHeaders =\n%q\nwant\n%q", got, want)
	}
	if string(e.RecordKey()) != "order-42" {
		t.Errorf("RecordKey = %q", e.RecordKey())
	}

	e.SagaID = ""
	for _, h := range e.RecordHeaders() {
		if h.Key == event.HeaderSagaID {
			t.Errorf("saga header present for empty SagaID")
		}
	}
}

func headersEqual(a, b []event.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

func envelopesEqual(a, b event.Envelope) bool {
	return a.ID == b.ID && a.Type == b.Type && a.Key == b.Key && a.SagaID == b.SagaID &&
		a.OccurredAt.Equal(b.OccurredAt) && bytes.Equal(a.Payload, b.Payload) &&
		maps.Equal(a.Headers, b.Headers)
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		modify func(*event.Envelope)
	}{
		{"plain", func(*event.Envelope) {}},
		{"saga and headers", func(e *event.Envelope) {
			e.SagaID = "saga-1"
			e.Headers = map[string]string{"traceparent": "00-abc", "tenant": "t1"}
		}},
		{"nanosecond time in a zone", func(e *event.Envelope) {
			e.OccurredAt = time.Date(2030, 1, 1, 0, 0, 0, 1, time.FixedZone("X", -7*3600))
		}},
		{"step id", func(e *event.Envelope) { e.ID = event.StepID("saga-1", "charge") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := validEnvelope(t)
			tt.modify(&in)
			out, err := event.FromRecord(in.RecordKey(), in.Payload, in.RecordHeaders())
			if err != nil {
				t.Fatalf("FromRecord: %v", err)
			}
			if !envelopesEqual(in, out) {
				t.Errorf("round trip changed the envelope:\n in %+v\nout %+v", in, out)
			}
			if out.OccurredAt.Location() != time.UTC {
				t.Errorf("decoded time not UTC: %v", out.OccurredAt)
			}
		})
	}
}

func TestFromRecordCopiesValue(t *testing.T) {
	t.Parallel()
	in := validEnvelope(t)
	value := bytes.Clone(in.Payload)
	out, err := event.FromRecord(in.RecordKey(), value, in.RecordHeaders())
	if err != nil {
		t.Fatal(err)
	}
	value[0] = 'X'
	if !bytes.Equal(out.Payload, in.Payload) {
		t.Errorf("Payload aliases the record value")
	}
}

// replace returns hs with the header named key set to value (appended if
// absent); drop removes it.
func replace(hs []event.Header, key, value string) []event.Header {
	out := make([]event.Header, 0, len(hs)+1)
	found := false
	for _, h := range hs {
		if h.Key == key {
			h.Value, found = []byte(value), true
		}
		out = append(out, h)
	}
	if !found {
		out = append(out, event.Header{Key: key, Value: []byte(value)})
	}
	return out
}

func drop(hs []event.Header, key string) []event.Header {
	out := make([]event.Header, 0, len(hs))
	for _, h := range hs {
		if h.Key != key {
			out = append(out, h)
		}
	}
	return out
}

func TestFromRecord(t *testing.T) {
	t.Parallel()
	base := validEnvelope(t)
	key, value, headers := base.RecordKey(), base.Payload, base.RecordHeaders()

	tests := []struct {
		name      string
		key       []byte
		value     []byte
		headers   []event.Header
		wantField string // "" means success
		wantErr   error
	}{
		{"valid", key, value, headers, "", nil},
		{"headers in any order", key, value, slices.Concat(headers[2:], headers[:2]), "", nil},
		{"unknown idem header ignored", key, value, slices.Concat(headers, []event.Header{{Key: "idem-future", Value: []byte("x")}}), "", nil},
		{"no headers", key, value, nil, event.HeaderEventID, event.ErrMissingHeader},
		{"missing id", key, value, drop(headers, event.HeaderEventID), event.HeaderEventID, event.ErrMissingHeader},
		{"empty id", key, value, replace(headers, event.HeaderEventID, ""), event.HeaderEventID, event.ErrInvalidID},
		{"garbage id", key, value, replace(headers, event.HeaderEventID, "not-a-uuid"), event.HeaderEventID, event.ErrInvalidID},
		{"urn id form", key, value, replace(headers, event.HeaderEventID, "urn:uuid:"+base.ID.String()), event.HeaderEventID, event.ErrInvalidID},
		{"36 chars not hex", key, value, replace(headers, event.HeaderEventID, strings.Repeat("z", 36)), event.HeaderEventID, event.ErrInvalidID},
		{"v4 id", key, value, replace(headers, event.HeaderEventID, "a4fdb2df-568e-471f-ba88-ff4dba30f6e4"), event.HeaderEventID, event.ErrInvalidID},
		{"nil id", key, value, replace(headers, event.HeaderEventID, "00000000-0000-0000-0000-000000000000"), event.HeaderEventID, event.ErrInvalidID},
		{"upper-case id", key, value, replace(headers, event.HeaderEventID, strings.ToUpper(base.ID.String())), "", nil},
		{"duplicate id", key, value, slices.Concat(headers, []event.Header{{Key: event.HeaderEventID, Value: []byte(base.ID.String())}}), event.HeaderEventID, event.ErrDuplicateHeader},
		{"missing type", key, value, drop(headers, event.HeaderEventType), event.HeaderEventType, event.ErrMissingHeader},
		{"bad type", key, value, replace(headers, event.HeaderEventType, "OrderCreated"), event.HeaderEventType, event.ErrInvalidType},
		{"missing time", key, value, drop(headers, event.HeaderOccurredAt), event.HeaderOccurredAt, event.ErrMissingHeader},
		{"bad time", key, value, replace(headers, event.HeaderOccurredAt, "yesterday"), event.HeaderOccurredAt, event.ErrInvalidTime},
		{"zero time", key, value, replace(headers, event.HeaderOccurredAt, "0001-01-01T00:00:00Z"), event.HeaderOccurredAt, event.ErrInvalidTime},
		{"duplicate saga", key, value, append(replace(headers, event.HeaderSagaID, "a"), event.Header{Key: event.HeaderSagaID, Value: []byte("b")}), event.HeaderSagaID, event.ErrDuplicateHeader},
		{"empty key", nil, value, headers, "key", event.ErrEmptyKey},
		{"tombstone", key, nil, headers, "value", event.ErrInvalidPayload},
		{"non-JSON value", key, []byte("\x00\x01"), headers, "value", event.ErrInvalidPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, err := event.FromRecord(tt.key, tt.value, tt.headers)
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("FromRecord: %v", err)
				}
				if e.ID != base.ID || e.Type != base.Type || e.Key != base.Key {
					t.Errorf("decoded %+v, want %+v", e, base)
				}
				return
			}
			var de *event.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v (%T), want *DecodeError", err, err)
			}
			if de.Field != tt.wantField {
				t.Errorf("Field = %q, want %q (err %v)", de.Field, tt.wantField, err)
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want it to wrap %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantField) {
				t.Errorf("message %q does not name the field", err)
			}
		})
	}
}

func TestFromRecordExtraHeaders(t *testing.T) {
	t.Parallel()
	base := validEnvelope(t)
	hs := append(base.RecordHeaders(),
		event.Header{Key: "tenant", Value: []byte("a")},
		event.Header{Key: "tenant", Value: []byte("b")},
		event.Header{Key: "bin", Value: []byte{0xff, 0x00}},
	)
	e, err := event.FromRecord(base.RecordKey(), base.Payload, hs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"tenant": "b", "bin": "\xff\x00"}
	if !maps.Equal(e.Headers, want) {
		t.Errorf("Headers = %q, want %q", e.Headers, want)
	}
}

// encodeHeaders packs headers for the fuzzer: "key=value" lines.
func encodeHeaders(hs []event.Header) []byte {
	var b bytes.Buffer
	for _, h := range hs {
		b.WriteString(h.Key)
		b.WriteByte('=')
		b.Write(h.Value)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func decodeHeaders(b []byte) []event.Header {
	var hs []event.Header
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		k, v, _ := bytes.Cut(line, []byte("="))
		hs = append(hs, event.Header{Key: string(k), Value: v})
	}
	return hs
}

// FuzzFromRecord checks that FromRecord never panics, that every failure is a
// *DecodeError, and that every envelope it accepts is valid and survives a
// second trip through RecordHeaders/FromRecord unchanged.
func FuzzFromRecord(f *testing.F) {
	e, err := event.New("OrderCreated.v1", "order-42", map[string]any{"amount": "10.0000"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(e.RecordKey(), e.Payload, encodeHeaders(e.RecordHeaders()))
	e.SagaID = "saga-1"
	e.ID = event.StepID(e.SagaID, "charge")
	e.Headers = map[string]string{"traceparent": "00-abc-def-01"}
	e.OccurredAt = time.Date(2024, 2, 29, 23, 59, 59, 999999999, time.UTC)
	f.Add(e.RecordKey(), e.Payload, encodeHeaders(e.RecordHeaders()))
	f.Add([]byte("k"), []byte("null"), []byte("idem-event-id=\nidem-event-type=A.v1\n"))
	f.Add([]byte(""), []byte(""), []byte(""))

	f.Fuzz(func(t *testing.T, key, value, rawHeaders []byte) {
		got, err := event.FromRecord(key, value, decodeHeaders(rawHeaders))
		if err != nil {
			var de *event.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is %T, want *DecodeError", err, err)
			}
			return
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("FromRecord accepted an invalid envelope: %v", err)
		}
		again, err := event.FromRecord(got.RecordKey(), got.Payload, got.RecordHeaders())
		if err != nil {
			t.Fatalf("re-decoding %+v: %v", got, err)
		}
		if !envelopesEqual(got, again) {
			t.Fatalf("round trip changed the envelope:\n%+v\n%+v", got, again)
		}
	})
}
