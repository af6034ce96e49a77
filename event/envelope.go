package event

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Envelope is one event as idem stores it in the outbox and publishes it to
// Kafka. Build it with New inside the business transaction and store it as it
// is; every later step (relay retries, consumer redeliveries) reuses it.
type Envelope struct {
	// ID identifies the business operation that produced the event. It is a
	// UUIDv7 generated once by New (or computed by DerivedID/StepIDAt/StepID)
	// and never regenerated on retry. Consumers deduplicate on it.
	ID uuid.UUID
	// Type names the event and its schema version, e.g. "OrderCreated.v1".
	// It must match TypePattern.
	Type string
	// Key is the aggregate ID (order ID, account ID, ...). It becomes the
	// Kafka record key, so all events of one aggregate land in one partition
	// and are consumed in the order they were published. Required.
	Key string
	// SagaID names the saga the event belongs to, if any. Optional.
	SagaID string
	// OccurredAt is when the business operation happened. New sets it to the
	// current UTC time truncated to microseconds, so it survives a round trip
	// through PostgreSQL's timestamptz unchanged.
	OccurredAt time.Time
	// Payload is the event body, a JSON document.
	Payload []byte
	// Headers are extra string headers published with the record (trace
	// context, tenant, ...). Names starting with ReservedHeaderPrefix
	// ("idem-"), and HeaderCESpecVersion (which would make FromRecord read
	// the record as a CloudEvent), are reserved for this package and
	// rejected by Validate.
	Headers map[string]string
}

// TypePattern is the pattern an event type must match: a name followed by a
// schema version, such as "OrderCreated.v1" or "payments.Refunded.v12".
const TypePattern = `^[A-Za-z][A-Za-z0-9_.-]*\.v[0-9]+$`

// MaxTypeLen is the longest event type Validate accepts, in bytes.
const MaxTypeLen = 255

// MaxKeyBytes is the longest aggregate key Validate accepts, in bytes. The
// outbox indexes events by key (PostgreSQL's B-tree entries hold at most
// about 2.7 KB), so a longer key could be enqueued but never marked failed
// or parked.
const MaxKeyBytes = 1024

// validType reports whether typ matches TypePattern. It is what
// regexp.MustCompile(TypePattern).MatchString does, written out: this runs
// for every event published and every record consumed, where the regexp
// was a third or more of a record's decoding time (BenchmarkValidType,
// idemkafka's BenchmarkEnvelope).
func validType(typ string) bool {
	// The version: ".v" then one or more digits, at the end. The digits
	// [0-9]+ match are the whole run of digits the type ends with, since the
	// byte before them must be 'v'.
	j := len(typ)
	for j > 0 && typ[j-1] >= '0' && typ[j-1] <= '9' {
		j--
	}
	if j == len(typ) || j < 3 || typ[j-1] != 'v' || typ[j-2] != '.' {
		return false
	}
	// The name: a letter, then letters, digits, '_', '.' or '-'.
	if !isASCIILetter(typ[0]) {
		return false
	}
	for i := 1; i < j-2; i++ {
		if c := typ[i]; !isASCIILetter(c) && (c < '0' || c > '9') && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

func isASCIILetter(c byte) bool { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') }

// New returns an envelope for a business operation happening now: a fresh
// UUIDv7 ID, OccurredAt set to the current UTC time truncated to microseconds,
// and payload encoded as JSON. A payload of type json.RawMessage or []byte is
// taken as already-encoded JSON (it is validated and compacted, not
// base64-encoded as encoding/json would do with a plain []byte).
//
// Call New once per business operation, inside the transaction that performs
// it, and store the result in the outbox; a retry must reuse the stored
// envelope, never call New again.
func New(typ, key string, payload any) (Envelope, error) {
	if raw, ok := payload.([]byte); ok {
		payload = json.RawMessage(raw)
	}
	body, err := json.Marshal(payload)
	if err != nil {
		return Envelope{}, fmt.Errorf("event: encode payload of %s: %w", typ, err)
	}
	id, err := NewID()
	if err != nil {
		return Envelope{}, fmt.Errorf("event: new id: %w", err)
	}
	e := Envelope{
		ID:         id,
		Type:       typ,
		Key:        key,
		OccurredAt: time.Now().UTC().Truncate(time.Microsecond),
		Payload:    body,
	}
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}

// Validate reports whether e can be published. The returned error wraps one
// of ErrInvalidID, ErrInvalidType, ErrEmptyKey, ErrInvalidTime,
// ErrInvalidPayload or ErrReservedHeader.
//
// ID must be a non-nil RFC 4122 UUID of version 7, or of version 5 (what
// StepID returns for a saga ID that is not a UUIDv7); OccurredAt lies in
// the years 0000-9999 in UTC (what its header can carry). An event to be
// stored in an outbox must also pass ValidateStorable (EnqueueTx checks).
func (e Envelope) Validate() error {
	if _, err := e.check(); err != nil {
		return fmt.Errorf("event: invalid envelope: %w", err)
	}
	return nil
}

// ValidateStorable is Validate plus what every outbox needs to store e as
// it is: the key is at most MaxKeyBytes, and the key, the saga ID and the
// headers' names and values are UTF-8 text without NUL bytes (outboxes
// store them as text and index the key: binary header values would be
// altered, NUL refused by PostgreSQL, a longer key refused by its index).
// The returned error may also wrap ErrInvalidKey or ErrInvalidText.
// outbox.EnqueueTx calls it; the publisher only Validate, so that events
// an outbox already holds are published as they are.
func (e Envelope) ValidateStorable() error {
	_, err := e.check()
	if err == nil {
		err = e.checkStorable()
	}
	if err != nil {
		return fmt.Errorf("event: invalid envelope: %w", err)
	}
	return nil
}

// checkStorable checks what an outbox needs beyond check.
func (e Envelope) checkStorable() error {
	switch {
	case len(e.Key) > MaxKeyBytes:
		return fmt.Errorf("%w: %d bytes, max %d", ErrInvalidKey, len(e.Key), MaxKeyBytes)
	case !isText(e.Key):
		return fmt.Errorf("%w: %q is not UTF-8 text without NUL bytes", ErrInvalidKey, truncate(e.Key))
	case !isText(e.SagaID):
		return fmt.Errorf("%w: saga id %q", ErrInvalidText, truncate(e.SagaID))
	}
	for name, value := range e.Headers {
		if !isText(name) || !isText(value) {
			return fmt.Errorf("%w: header %q", ErrInvalidText, truncate(name))
		}
	}
	return nil
}

// isText reports whether s is valid UTF-8 without NUL bytes.
func isText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// check validates e and returns, on failure, the name of the Kafka record
// part that holds the bad field (a header name, "key" or "value") for
// FromRecord's DecodeError.
func (e Envelope) check() (string, error) {
	if err := checkID(e.ID); err != nil {
		return HeaderEventID, err
	}
	if len(e.Type) > MaxTypeLen || !validType(e.Type) {
		return HeaderEventType, fmt.Errorf("%w: %q does not match %s (max %d bytes)",
			ErrInvalidType, truncate(e.Type), TypePattern, MaxTypeLen)
	}
	if e.Key == "" {
		return "key", ErrEmptyKey
	}
	if e.OccurredAt.IsZero() {
		return HeaderOccurredAt, ErrInvalidTime
	}
	if y := e.OccurredAt.UTC().Year(); y < 0 || y > 9999 {
		return HeaderOccurredAt, fmt.Errorf("%w: year %d in UTC, want 0000-9999", ErrInvalidTime, y)
	}
	if !json.Valid(e.Payload) {
		return "value", ErrInvalidPayload
	}
	for name := range e.Headers {
		// ce_specversion would make FromRecord read the record as a
		// CloudEvent, which the idem headers alone are not: undecodable.
		if name == "" || isReserved(name) || name == HeaderCESpecVersion {
			return name, fmt.Errorf("%w: %q", ErrReservedHeader, truncate(name))
		}
	}
	return "", nil
}

func checkID(id uuid.UUID) error {
	if id == uuid.Nil {
		return fmt.Errorf("%w: nil UUID", ErrInvalidID)
	}
	if id.Variant() != uuid.RFC4122 {
		return fmt.Errorf("%w: %s is not an RFC 4122 UUID", ErrInvalidID, id)
	}
	if v := id.Version(); v != 7 && v != 5 {
		return fmt.Errorf("%w: %s is a version %d UUID, want 7 (event.NewID) or 5 (a StepID fallback)", ErrInvalidID, id, v)
	}
	return nil
}

func isReserved(name string) bool {
	return len(name) >= len(ReservedHeaderPrefix) &&
		strings.EqualFold(name[:len(ReservedHeaderPrefix)], ReservedHeaderPrefix)
}

// truncate shortens s for error messages, to at most 64 bytes and "...".
// It cuts before a UTF-8 character that would not fit, not inside it (a
// cut inside shows as \x escapes under %q, as if s were not UTF-8); in s
// that is not UTF-8 it backs up at most utf8.UTFMax-1 bytes.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	n := max
	for i := max; i > max-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			n = i
			break
		}
	}
	return s[:n] + "..."
}
