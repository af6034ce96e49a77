package event

import (
	"errors"
	"fmt"
)

// ErrPoison marks an error that retrying cannot fix: an event that cannot
// be published (the outbox relay parks it at once) or cannot be applied (a
// Kafka consumer dead-letters it at once). It is the one poison error of
// idem: outbox.ErrPoison and idemkafka.ErrPoison are this same value, so
// domain code returns event.ErrPoison (wrapped with %w) without linking a
// Kafka client.
var ErrPoison = errors.New("idem: poison event")

// Errors wrapped by Validate, ValidateStorable and FromRecord; test for
// them with errors.Is.
var (
	// ErrInvalidID: the ID is nil, not RFC 4122, or not version 7 (or 5).
	ErrInvalidID = errors.New("invalid event id")
	// ErrInvalidType: the type does not match TypePattern or is too long.
	ErrInvalidType = errors.New("invalid event type")
	// ErrEmptyKey: the aggregate key (Kafka record key) is empty.
	ErrEmptyKey = errors.New("empty event key")
	// ErrInvalidKey: the aggregate key is longer than MaxKeyBytes, or is
	// not valid UTF-8, or holds a NUL byte (ValidateStorable: what an
	// outbox can store and index).
	ErrInvalidKey = errors.New("invalid event key")
	// ErrInvalidText: a header name or value, or the saga ID, is not valid
	// UTF-8 or holds a NUL byte (ValidateStorable: outboxes store them as
	// text).
	ErrInvalidText = errors.New("header or saga id is not text")
	// ErrInvalidTime: OccurredAt is the zero time or its header is not RFC 3339.
	ErrInvalidTime = errors.New("invalid occurred-at time")
	// ErrInvalidPayload: the payload is not a JSON document.
	ErrInvalidPayload = errors.New("payload is not valid JSON")
	// ErrReservedHeader: an extra header is empty, uses the "idem-" prefix
	// or is named "ce_specversion" (or, for RecordHeadersWith with a
	// CloudEvents format, uses the "ce_" prefix).
	ErrReservedHeader = errors.New("reserved or empty header name")
	// ErrMissingHeader: a required idem or CloudEvents header is absent
	// from the record.
	ErrMissingHeader = errors.New("missing header")
	// ErrDuplicateHeader: an idem or CloudEvents header appears more than
	// once in the record.
	ErrDuplicateHeader = errors.New("duplicate header")
	// ErrHeaderMismatch: a record carries both the idem and the CloudEvents
	// headers, and they disagree on the event's ID, type, occurrence time
	// or saga ID.
	ErrHeaderMismatch = errors.New("idem and CloudEvents headers disagree")
	// ErrUnsupportedSpecVersion: the ce_specversion header is not "1.0".
	ErrUnsupportedSpecVersion = errors.New("unsupported CloudEvents specversion")
)

// DecodeError is returned by FromRecord when a record is not a valid idem
// event. Field names the part of the record at fault: a header name such as
// HeaderEventID, or "key" or "value". A consumer usually sends such a record
// to a dead-letter topic: retrying cannot fix it.
type DecodeError struct {
	Field string
	Err   error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("event: decode record: %s: %v", truncate(e.Field), e.Err)
}

// Unwrap returns the cause, so errors.Is(err, ErrMissingHeader) and the like
// work through a DecodeError.
func (e *DecodeError) Unwrap() error { return e.Err }
