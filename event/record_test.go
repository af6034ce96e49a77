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
		{"time before year 0 in UTC", key, value, replace(headers, event.HeaderOccurredAt, "0000-01-01T00:00:00+01:00"), event.HeaderOccurredAt, event.ErrInvalidTime},
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
	for _, format := range []event.HeaderFormat{event.HeaderFormatCloudEvents, event.HeaderFormatBoth} {
		hs, err := e.RecordHeadersWith(event.HeaderOptions{Format: format, Source: "/idem"})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(e.RecordKey(), e.Payload, encodeHeaders(hs))
	}
	f.Add([]byte("k"), []byte("{}"), []byte("ce_specversion=1.0\nce_id=017f22e2-79b0-7cc3-98c4-dc0c0c07398f\nce_type=A.v1\nce_time=2020-01-01t00:00:00+01:00\ncontent-type=application/json\n"))
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

		// The CloudEvents format round-trips too, except that a
		// content-type of application/json is read as the CloudEvents
		// datacontenttype and not kept.
		hs, err := got.RecordHeadersWith(event.HeaderOptions{Format: event.HeaderFormatBoth, Source: "/idem"})
		if err != nil {
			if !errors.Is(err, event.ErrReservedHeader) {
				t.Fatalf("RecordHeadersWith(%+v): %v", got, err)
			}
			return // a ce_ header, taken from a record that was not a CloudEvent
		}
		again, err = event.FromRecord(got.RecordKey(), got.Payload, hs)
		if err != nil {
			t.Fatalf("re-decoding %+v as a CloudEvent: %v", got, err)
		}
		if got.Headers["content-type"] == "application/json" {
			got.Headers = maps.Clone(got.Headers)
			delete(got.Headers, "content-type")
		}
		if !envelopesEqual(got, again) {
			t.Fatalf("CloudEvents round trip changed the envelope:\n%+v\n%+v", got, again)
		}
	})
}

// ceEnvelope is validEnvelope with a fixed time, a saga and extra headers.
func ceEnvelope(t *testing.T) event.Envelope {
	t.Helper()
	e := validEnvelope(t)
	e.OccurredAt = time.Date(2025, 3, 4, 5, 6, 7, 890123000, time.FixedZone("CET", 3600))
	e.SagaID = "saga-7"
	e.Headers = map[string]string{"traceparent": "00-1", "a": "1"}
	return e
}

func TestRecordHeadersWith(t *testing.T) {
	t.Parallel()
	e := ceEnvelope(t)
	id := []byte(e.ID.String())
	idem := []event.Header{
		{Key: "idem-event-id", Value: id},
		{Key: "idem-event-type", Value: []byte("OrderCreated.v1")},
		{Key: "idem-saga-id", Value: []byte("saga-7")},
		{Key: "idem-occurred-at", Value: []byte("2025-03-04T04:06:07.890123Z")},
	}
	ce := []event.Header{
		{Key: "ce_specversion", Value: []byte("1.0")},
		{Key: "ce_id", Value: id},
		{Key: "ce_source", Value: []byte("/idem")},
		{Key: "ce_type", Value: []byte("OrderCreated.v1")},
		{Key: "ce_subject", Value: []byte("order-42")},
		{Key: "ce_time", Value: []byte("2025-03-04T04:06:07.890123Z")},
		{Key: "ce_partitionkey", Value: []byte("order-42")},
		{Key: "ce_idemsagaid", Value: []byte("saga-7")},
		{Key: "content-type", Value: []byte("application/json")},
	}
	extra := []event.Header{{Key: "a", Value: []byte("1")}, {Key: "traceparent", Value: []byte("00-1")}}
	for _, tt := range []struct {
		opts event.HeaderOptions
		want []event.Header
	}{
		{event.HeaderOptions{}, slices.Concat(idem, extra)},
		{event.HeaderOptions{Source: "/ignored"}, slices.Concat(idem, extra)},
		{event.HeaderOptions{Format: event.HeaderFormatCloudEvents, Source: "/idem"}, slices.Concat(ce, extra)},
		{event.HeaderOptions{Format: event.HeaderFormatBoth, Source: "/idem"}, slices.Concat(idem, ce, extra)},
	} {
		t.Run(tt.opts.Format.String(), func(t *testing.T) {
			got, err := e.RecordHeadersWith(tt.opts)
			if err != nil {
				t.Fatalf("RecordHeadersWith: %v", err)
			}
			if !headersEqual(got, tt.want) {
				t.Errorf("RecordHeadersWith(%+v) =\n%q\nwant\n%q", tt.opts, got, tt.want)
			}
		})
	}
	if got := e.RecordHeaders(); !headersEqual(got, slices.Concat(idem, extra)) {
		t.Errorf("RecordHeaders = %q", got)
	}

	// No saga: no saga headers. A content-type of the envelope's own
	// replaces the default one.
	e.SagaID = ""
	e.Headers = map[string]string{"content-type": "application/vnd.orders+json"}
	got, err := e.RecordHeadersWith(event.HeaderOptions{Format: event.HeaderFormatCloudEvents, Source: "/idem"})
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Concat(slices.Delete(slices.Clone(ce), 7, 9), []event.Header{{Key: "content-type", Value: []byte("application/vnd.orders+json")}})
	if !headersEqual(got, want) {
		t.Errorf("without saga, own content-type:\n%q\nwant\n%q", got, want)
	}
}

func TestRecordHeadersWithRejects(t *testing.T) {
	t.Parallel()
	e := validEnvelope(t)
	ce := event.HeaderOptions{Format: event.HeaderFormatCloudEvents, Source: "/idem"}
	for name, tt := range map[string]struct {
		opts    event.HeaderOptions
		headers map[string]string
		want    error // nil: any error
	}{
		"cloudevents without source": {opts: event.HeaderOptions{Format: event.HeaderFormatCloudEvents}},
		"both without source":        {opts: event.HeaderOptions{Format: event.HeaderFormatBoth}},
		"source with a space":        {opts: event.HeaderOptions{Format: event.HeaderFormatBoth, Source: "/my service"}},
		"source not a URI":           {opts: event.HeaderOptions{Format: event.HeaderFormatBoth, Source: "http://[::1"}},
		"unknown format":             {opts: event.HeaderOptions{Format: 9, Source: "/idem"}},
		"ce_ extra header":           {opts: ce, headers: map[string]string{"ce_traceparent": "x"}, want: event.ErrReservedHeader},
		"CE_ extra header, both":     {opts: event.HeaderOptions{Format: event.HeaderFormatBoth, Source: "/idem"}, headers: map[string]string{"CE_ID": "x"}, want: event.ErrReservedHeader},
	} {
		e := e
		e.Headers = tt.headers
		_, err := e.RecordHeadersWith(tt.opts)
		if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("%s: RecordHeadersWith = %v; want an error (wrapping %v)", name, err, tt.want)
		}
		if tt.want == nil && tt.opts.Validate() == nil {
			t.Errorf("%s: Validate accepted %+v", name, tt.opts)
		}
	}
	// ce_ extra headers are nothing special in the idem format.
	e.Headers = map[string]string{"ce_traceparent": "x"}
	if _, err := e.RecordHeadersWith(event.HeaderOptions{}); err != nil {
		t.Errorf("idem format with a ce_ header: %v", err)
	}
}

func TestHeaderFormatText(t *testing.T) {
	t.Parallel()
	for _, f := range []event.HeaderFormat{event.HeaderFormatIdem, event.HeaderFormatCloudEvents, event.HeaderFormatBoth} {
		b, err := f.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back event.HeaderFormat
		if err := back.UnmarshalText(b); err != nil || back != f {
			t.Errorf("%v: UnmarshalText(%q) = %v, %v", f, b, back, err)
		}
	}
	for s, want := range map[string]event.HeaderFormat{"": event.HeaderFormatIdem, "CloudEvents": event.HeaderFormatCloudEvents, "BOTH": event.HeaderFormatBoth} {
		if got, err := event.ParseHeaderFormat(s); err != nil || got != want {
			t.Errorf("ParseHeaderFormat(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := event.ParseHeaderFormat("ce"); err == nil {
		t.Error(`ParseHeaderFormat("ce"): no error`)
	}
	if _, err := event.HeaderFormat(3).MarshalText(); err == nil {
		t.Error("MarshalText of an unknown format: no error")
	}
	if s := event.HeaderFormat(3).String(); s != "HeaderFormat(3)" {
		t.Errorf("String = %q", s)
	}
}

// Every format decodes to the envelope it was written from.
func TestRecordRoundTripFormats(t *testing.T) {
	t.Parallel()
	for _, f := range []event.HeaderFormat{event.HeaderFormatIdem, event.HeaderFormatCloudEvents, event.HeaderFormatBoth} {
		for name, modify := range map[string]func(*event.Envelope){
			"plain": func(*event.Envelope) {},
			"saga and headers": func(e *event.Envelope) {
				e.SagaID = "saga-1"
				e.Headers = map[string]string{"traceparent": "00-abc", "Content-Type": "text/x"}
			},
			"own content-type": func(e *event.Envelope) {
				e.Headers = map[string]string{"content-type": "application/vnd.orders+json"}
			},
			"nanosecond time in a zone": func(e *event.Envelope) {
				e.OccurredAt = time.Date(2030, 1, 1, 0, 0, 0, 1, time.FixedZone("X", -7*3600))
			},
			"step id (v5)": func(e *event.Envelope) { e.ID = event.StepID("saga-1", "charge") },
		} {
			t.Run(f.String()+"/"+name, func(t *testing.T) {
				t.Parallel()
				in := validEnvelope(t)
				modify(&in)
				hs, err := in.RecordHeadersWith(event.HeaderOptions{Format: f, Source: "/idem"})
				if err != nil {
					t.Fatal(err)
				}
				out, err := event.FromRecord(in.RecordKey(), in.Payload, hs)
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
}

func TestFromRecordCloudEvents(t *testing.T) {
	t.Parallel()
	base := validEnvelope(t)
	base.SagaID = "saga-1"
	key, value := base.RecordKey(), base.Payload
	ce, err := base.RecordHeadersWith(event.HeaderOptions{Format: event.HeaderFormatCloudEvents, Source: "/idem"})
	if err != nil {
		t.Fatal(err)
	}
	both, err := base.RecordHeadersWith(event.HeaderOptions{Format: event.HeaderFormatBoth, Source: "/idem"})
	if err != nil {
		t.Fatal(err)
	}
	other := event.DerivedID(base.ID, "other").String()
	at := base.OccurredAt

	tests := []struct {
		name      string
		headers   []event.Header
		wantField string // "" means success
		wantErr   error
		wantAt    time.Time // zero: base.OccurredAt
		check     func(t *testing.T, e event.Envelope)
	}{
		{name: "cloudevents", headers: ce},
		{name: "both", headers: both},
		{name: "both, headers in any order", headers: slices.Concat(both[6:], both[:6])},
		{name: "minimal cloudevent", headers: []event.Header{
			{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte(base.ID.String())},
			{Key: "ce_type", Value: []byte(base.Type)}, {Key: "ce_time", Value: []byte(at.Format(time.RFC3339Nano))},
		}, check: func(t *testing.T, e event.Envelope) {
			if e.SagaID != "" || e.Headers != nil {
				t.Errorf("saga %q, headers %q; want none", e.SagaID, e.Headers)
			}
		}},
		{name: "unknown ce_ headers and content-type not kept", headers: slices.Concat(ce, []event.Header{
			{Key: "ce_traceparent", Value: []byte("00-1")}, {Key: "CE_Other", Value: []byte("x")}, {Key: "tenant", Value: []byte("t1")},
		}), check: func(t *testing.T, e event.Envelope) {
			if want := map[string]string{"tenant": "t1"}; !maps.Equal(e.Headers, want) {
				t.Errorf("Headers = %q; want %q", e.Headers, want)
			}
		}},
		{name: "other content-type kept", headers: replace(ce, "content-type", "application/vnd.x+json"), check: func(t *testing.T, e event.Envelope) {
			if want := map[string]string{"content-type": "application/vnd.x+json"}; !maps.Equal(e.Headers, want) {
				t.Errorf("Headers = %q; want %q", e.Headers, want)
			}
		}},
		{name: "without specversion ce_ headers are ordinary", headers: slices.Concat(base.RecordHeaders(), drop(ce, "ce_specversion")), check: func(t *testing.T, e event.Envelope) {
			if e.Headers["ce_id"] != base.ID.String() || e.Headers["content-type"] != "application/json" || len(e.Headers) != 8 {
				t.Errorf("Headers = %q; want the ce_ headers and content-type", e.Headers)
			}
		}},
		{name: "ce_time with an offset", headers: replace(ce, "ce_time", at.In(time.FixedZone("X", 5*3600+1800)).Format(time.RFC3339Nano))},
		{name: "ce_time lower case", headers: replace(ce, "ce_time", strings.ToLower(at.Format(time.RFC3339Nano)))},
		{name: "both, ce_time in another zone", headers: replace(both, "ce_time", at.In(time.FixedZone("X", -3600)).Format(time.RFC3339Nano))},
		{name: "ce_time without fraction", headers: replace(ce, "ce_time", "2024-02-29T23:59:59Z"), wantAt: time.Date(2024, 2, 29, 23, 59, 59, 0, time.UTC)},
		{name: "upper-case ce_id", headers: replace(ce, "ce_id", strings.ToUpper(base.ID.String()))},
		{name: "source and subject not checked", headers: drop(replace(ce, "ce_subject", "other"), "ce_source")},

		{name: "missing ce_id", headers: drop(ce, "ce_id"), wantField: "ce_id", wantErr: event.ErrMissingHeader},
		{name: "both, missing ce_id", headers: drop(both, "ce_id"), wantField: "ce_id", wantErr: event.ErrMissingHeader},
		{name: "v4 ce_id", headers: replace(ce, "ce_id", "a4fdb2df-568e-471f-ba88-ff4dba30f6e4"), wantField: "ce_id", wantErr: event.ErrInvalidID},
		{name: "garbage ce_id", headers: replace(ce, "ce_id", "order-42-created"), wantField: "ce_id", wantErr: event.ErrInvalidID},
		{name: "urn ce_id", headers: replace(ce, "ce_id", "urn:uuid:"+base.ID.String()), wantField: "ce_id", wantErr: event.ErrInvalidID},
		{name: "missing ce_type", headers: drop(ce, "ce_type"), wantField: "ce_type", wantErr: event.ErrMissingHeader},
		{name: "bad ce_type", headers: replace(ce, "ce_type", "com.example.order.created"), wantField: "ce_type", wantErr: event.ErrInvalidType},
		{name: "missing ce_time", headers: drop(ce, "ce_time"), wantField: "ce_time", wantErr: event.ErrMissingHeader},
		{name: "bad ce_time", headers: replace(ce, "ce_time", "2025-03-04 05:06:07"), wantField: "ce_time", wantErr: event.ErrInvalidTime},
		{name: "zero ce_time", headers: replace(ce, "ce_time", "0001-01-01T00:00:00Z"), wantField: "ce_time", wantErr: event.ErrInvalidTime},
		{name: "ce_time before year 0 in UTC", headers: replace(ce, "ce_time", "0000-01-01t00:00:00+01:00"), wantField: "ce_time", wantErr: event.ErrInvalidTime},
		{name: "specversion 0.3", headers: replace(ce, "ce_specversion", "0.3"), wantField: "ce_specversion", wantErr: event.ErrUnsupportedSpecVersion},
		{name: "duplicate ce_id", headers: slices.Concat(ce, []event.Header{{Key: "ce_id", Value: []byte(base.ID.String())}}), wantField: "ce_id", wantErr: event.ErrDuplicateHeader},
		{name: "duplicate specversion", headers: slices.Concat(ce, []event.Header{{Key: "ce_specversion", Value: []byte("1.0")}}), wantField: "ce_specversion", wantErr: event.ErrDuplicateHeader},
		{name: "both, ids disagree", headers: replace(both, "ce_id", other), wantField: "ce_id", wantErr: event.ErrHeaderMismatch},
		{name: "both, types disagree", headers: replace(both, "ce_type", "OrderPaid.v1"), wantField: "ce_type", wantErr: event.ErrHeaderMismatch},
		{name: "both, times disagree", headers: replace(both, "ce_time", at.Add(time.Microsecond).Format(time.RFC3339Nano)), wantField: "ce_time", wantErr: event.ErrHeaderMismatch},
		{name: "both, sagas disagree", headers: replace(both, "ce_idemsagaid", "saga-2"), wantField: "ce_idemsagaid", wantErr: event.ErrHeaderMismatch},
		{name: "both, saga only in idem", headers: drop(both, "ce_idemsagaid"), wantField: "ce_idemsagaid", wantErr: event.ErrHeaderMismatch},
		{name: "both, idem set incomplete", headers: drop(both, "idem-event-type"), wantField: "idem-event-type", wantErr: event.ErrMissingHeader},
		{name: "cloudevent with a stray idem header", headers: slices.Concat(ce, []event.Header{{Key: "idem-saga-id", Value: []byte("saga-1")}}), wantField: "idem-event-id", wantErr: event.ErrMissingHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, err := event.FromRecord(key, value, tt.headers)
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("FromRecord: %v", err)
				}
				wantAt := base.OccurredAt
				if !tt.wantAt.IsZero() {
					wantAt = tt.wantAt
				}
				if e.ID != base.ID || e.Type != base.Type || e.Key != base.Key || !e.OccurredAt.Equal(wantAt) ||
					e.OccurredAt.Location() != time.UTC || !bytes.Equal(e.Payload, base.Payload) {
					t.Errorf("decoded %+v, want %+v", e, base)
				}
				if tt.check != nil {
					tt.check(t, e)
				} else if e.SagaID != base.SagaID || len(e.Headers) != 0 {
					t.Errorf("saga %q, headers %q; want %q and none", e.SagaID, e.Headers, base.SagaID)
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
		})
	}
}

// An extra header named ce_specversion makes FromRecord read the record as
// a CloudEvent, whose ce_id, ce_type and ce_time an envelope published with
// the idem headers lacks: every consumer would dead-letter it. Validate
// refuses it; other "ce_" names still travel as plain headers.
func TestValidateRefusesCESpecVersionHeader(t *testing.T) {
	t.Parallel()
	e := validEnvelope(t)
	e.Headers = map[string]string{event.HeaderCESpecVersion: event.CloudEventsSpecVersion}
	if err := e.Validate(); !errors.Is(err, event.ErrReservedHeader) {
		_, decErr := event.FromRecord(e.RecordKey(), e.Payload, e.RecordHeaders())
		t.Fatalf("Validate = %v, want ErrReservedHeader (FromRecord of its record: %v)", err, decErr)
	}

	e.Headers = map[string]string{"ce_custom": "x"}
	if err := e.Validate(); err != nil {
		t.Fatalf("Validate with a ce_custom header: %v", err)
	}
	out, err := event.FromRecord(e.RecordKey(), e.Payload, e.RecordHeaders())
	if err != nil || !envelopesEqual(e, out) {
		t.Fatalf("round trip with a ce_custom header = %+v, %v; want %+v", out, err, e)
	}
}

// Go's time.Parse (and time.Time.UnmarshalText, whose strict RFC 3339 checks
// are disabled, go.dev/issue/54580) accept times that are not RFC 3339: a
// one-digit hour, a comma before the fraction, an offset of +24:00 or with
// 60 minutes. FromRecord must refuse them in both time headers, as
// ErrInvalidTime promises, not read an instant out of them.
func TestFromRecordRejectsNonRFC3339Time(t *testing.T) {
	t.Parallel()
	e := validEnvelope(t)
	ce, err := e.RecordHeadersWith(event.HeaderOptions{Format: event.HeaderFormatCloudEvents, Source: "/idem"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"2026-12-04T1:00:00Z",
		"2026-12-04T14:00:00,5Z",
		"2026-12-04T14:00:00+24:00",
		"2026-12-04T14:00:00+23:60",
		"2026-12-04T14:00:00-99:00",
	} {
		for _, rec := range []struct {
			field   string
			headers []event.Header
		}{
			{event.HeaderOccurredAt, replace(e.RecordHeaders(), event.HeaderOccurredAt, s)},
			{event.HeaderCETime, replace(ce, event.HeaderCETime, s)},
		} {
			got, err := event.FromRecord(e.RecordKey(), e.Payload, rec.headers)
			var de *event.DecodeError
			if !errors.As(err, &de) || de.Field != rec.field || !errors.Is(err, event.ErrInvalidTime) {
				t.Errorf("%s %q: FromRecord = %v, %v; want a DecodeError on %s wrapping ErrInvalidTime",
					rec.field, s, got.OccurredAt, err, rec.field)
			}
		}
	}
	// What RFC 3339 allows is still read: any fraction, an offset, lower case
	// in ce_time (the idem header is written in upper case).
	for _, s := range []string{"2026-12-04T14:00:00.1234567891Z", "2026-12-04T14:00:00-23:59", "2026-12-04T14:00:00+00:00"} {
		for _, hs := range [][]event.Header{replace(e.RecordHeaders(), event.HeaderOccurredAt, s), replace(ce, event.HeaderCETime, strings.ToLower(s))} {
			if _, err := event.FromRecord(e.RecordKey(), e.Payload, hs); err != nil {
				t.Errorf("%q: %v", s, err)
			}
		}
	}
}

// A CloudEvent in structured mode (the whole event in the value, no ce_
// header) is not read; the error says so, instead of only that the idem ID
// header is missing, which sends its reader looking for an idem producer.
func TestFromRecordStructuredCloudEvent(t *testing.T) {
	t.Parallel()
	value := []byte(`{"specversion":"1.0","id":"0190b6c1-9a7e-7cc3-8d1e-0123456789ab","type":"OrderCreated.v1","source":"/java","time":"2025-01-02T03:04:05Z","data":{}}`)
	for _, ct := range []string{"application/cloudevents+json", "application/cloudevents+json; charset=UTF-8", "Application/CloudEvents-Batch+JSON"} {
		_, err := event.FromRecord([]byte("order-1"), value, []event.Header{{Key: "content-type", Value: []byte(ct)}})
		var de *event.DecodeError
		if !errors.As(err, &de) || !errors.Is(err, event.ErrMissingHeader) || de.Field != event.HeaderEventID {
			t.Fatalf("%s: %v; want a DecodeError of %s wrapping ErrMissingHeader", ct, err, event.HeaderEventID)
		}
		if !strings.Contains(err.Error(), "structured mode") {
			t.Errorf("%s: %q does not say the record is a CloudEvent in structured mode", ct, err)
		}
	}
	// Other records without the ID header keep the plain message.
	_, err := event.FromRecord([]byte("order-1"), []byte(`{}`), []event.Header{{Key: "content-type", Value: []byte("application/json")}})
	if err == nil || strings.Contains(err.Error(), "structured") {
		t.Errorf("plain record: %v", err)
	}
}
