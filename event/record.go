package event

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Header names under which an envelope's fields travel in a Kafka record.
const (
	// HeaderEventID holds Envelope.ID in canonical text form.
	HeaderEventID = "idem-event-id"
	// HeaderEventType holds Envelope.Type.
	HeaderEventType = "idem-event-type"
	// HeaderSagaID holds Envelope.SagaID; absent when it is empty.
	HeaderSagaID = "idem-saga-id"
	// HeaderOccurredAt holds Envelope.OccurredAt in UTC, time.RFC3339Nano.
	HeaderOccurredAt = "idem-occurred-at"
	// ReservedHeaderPrefix starts every header name this package owns.
	// FromRecord ignores unknown headers with this prefix, so a consumer
	// keeps working when a newer producer adds one.
	ReservedHeaderPrefix = "idem-"
)

// Header is one Kafka record header. It has the fields of kgo.RecordHeader,
// so the Kafka glue converts with kgo.RecordHeader(h) and back without
// this package importing a Kafka client.
type Header struct {
	Key   string
	Value []byte
}

// RecordKey returns the Kafka record key: the aggregate key.
func (e Envelope) RecordKey() []byte { return []byte(e.Key) }

// RecordHeaders returns the Kafka record headers for e: the idem headers
// (ID, type, saga ID when set, occurrence time) followed by e.Headers sorted
// by name. The record value is e.Payload and the record key e.RecordKey().
func (e Envelope) RecordHeaders() []Header {
	hs := make([]Header, 0, 4+len(e.Headers))
	hs = append(hs,
		Header{HeaderEventID, []byte(e.ID.String())},
		Header{HeaderEventType, []byte(e.Type)},
	)
	if e.SagaID != "" {
		hs = append(hs, Header{HeaderSagaID, []byte(e.SagaID)})
	}
	hs = append(hs, Header{HeaderOccurredAt, []byte(e.OccurredAt.UTC().Format(time.RFC3339Nano))})
	names := make([]string, 0, len(e.Headers))
	for name := range e.Headers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		hs = append(hs, Header{name, []byte(e.Headers[name])})
	}
	return hs
}

// FromRecord rebuilds an envelope from a Kafka record's key, value and
// headers, and validates it. Any failure is a *DecodeError naming the record
// part at fault and wrapping one of the package's Err values: a missing id
// header wraps ErrMissingHeader, an unparsable or non-v7 one ErrInvalidID.
//
// The id, type and occurred-at headers are required, the saga-id header is
// optional; each may appear at most once. Unknown headers with the "idem-"
// prefix are ignored; other headers go to Envelope.Headers (the last value
// wins if a name repeats). Value is copied, so the caller may reuse it.
func FromRecord(key, value []byte, headers []Header) (Envelope, error) {
	var (
		e                             Envelope
		id, typ, at, saga             []byte
		hasID, hasTyp, hasAt, hasSaga bool
	)
	for _, h := range headers {
		var dst *[]byte
		var seen *bool
		switch h.Key {
		case HeaderEventID:
			dst, seen = &id, &hasID
		case HeaderEventType:
			dst, seen = &typ, &hasTyp
		case HeaderOccurredAt:
			dst, seen = &at, &hasAt
		case HeaderSagaID:
			dst, seen = &saga, &hasSaga
		default:
			if isReserved(h.Key) {
				continue // a newer producer's header; not ours to judge
			}
			if e.Headers == nil {
				e.Headers = make(map[string]string)
			}
			e.Headers[h.Key] = string(h.Value)
			continue
		}
		if *seen {
			return Envelope{}, &DecodeError{Field: h.Key, Err: ErrDuplicateHeader}
		}
		*dst, *seen = h.Value, true
	}

	if !hasID {
		return Envelope{}, &DecodeError{Field: HeaderEventID, Err: ErrMissingHeader}
	}
	var err error
	if e.ID, err = parseID(id); err != nil {
		return Envelope{}, &DecodeError{Field: HeaderEventID, Err: err}
	}
	if !hasTyp {
		return Envelope{}, &DecodeError{Field: HeaderEventType, Err: ErrMissingHeader}
	}
	e.Type = string(typ)
	if !hasAt {
		return Envelope{}, &DecodeError{Field: HeaderOccurredAt, Err: ErrMissingHeader}
	}
	t, err := time.Parse(time.RFC3339Nano, string(at))
	if err != nil {
		return Envelope{}, &DecodeError{Field: HeaderOccurredAt, Err: fmt.Errorf("%w: %w", ErrInvalidTime, err)}
	}
	e.OccurredAt = t.UTC()
	e.SagaID = string(saga)
	e.Key = string(key)
	e.Payload = bytes.Clone(value)

	if field, err := e.check(); err != nil {
		return Envelope{}, &DecodeError{Field: field, Err: err}
	}
	return e, nil
}

// parseID accepts only the canonical 36-character form that RecordHeaders
// writes (hex digits in either case), so one ID has one spelling on the wire.
func parseID(b []byte) (uuid.UUID, error) {
	if len(b) != 36 {
		return uuid.Nil, fmt.Errorf("%w: %q is not a canonical UUID", ErrInvalidID, truncate(string(b)))
	}
	id, err := uuid.ParseBytes(b)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if err := checkID(id); err != nil {
		return uuid.Nil, err
	}
	return id, nil
}
