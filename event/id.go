package event

import (
	"crypto/sha256"
	"encoding/binary"
	"time"

	"github.com/google/uuid"
)

// Namespace is the UUID that namespaces every deterministic ID computed by
// this package (StepID, StepIDAt, DerivedID). It is part of the wire
// contract: changing it changes every derived ID, so a retry running new code
// would no longer match the IDs emitted by old code.
const Namespace = "a4fdb2df-568e-471f-ba88-ff4dba30f6e4"

// namespace is Namespace parsed once; it is never modified.
var namespace = uuid.MustParse(Namespace)

// Domain tags keep the hash inputs of the different ID kinds apart, so that
// StepIDAt("a", "b", t) can never equal a DerivedID of some parent.
const (
	domainStep    = "idem/step/v1"
	domainDerived = "idem/derived/v1"
)

// maxUnixMilli is the largest timestamp a UUIDv7 can hold (48 bits).
const maxUnixMilli = 1<<48 - 1

// NewID returns a new random UUIDv7 for a new business operation.
// It is what New uses; call it when an ID is needed before the envelope, for
// example to return it to the HTTP client that started the operation.
func NewID() (uuid.UUID, error) {
	return uuid.NewV7()
}

// TimeOf returns the creation time embedded in a UUIDv7 (millisecond
// precision, UTC). It reports false when id is not a version 7 UUID with the
// RFC 4122 variant, for example a StepID fallback (UUIDv5) or a UUIDv4.
func TimeOf(id uuid.UUID) (time.Time, bool) {
	if id.Version() != 7 || id.Variant() != uuid.RFC4122 {
		return time.Time{}, false
	}
	return time.UnixMilli(unixMilliOf(id)).UTC(), true
}

// DerivedID returns the ID of an event emitted while handling the event (or
// operation) parent, named name, for example DerivedID(orderCreated.ID,
// "PaymentRequested"). The same parent and name always give the same ID, so a
// handler that re-runs after a redelivery re-emits identical events and the
// downstream inbox deduplicates them.
//
// The result is UUIDv7-shaped: its first 48 bits are copied from parent, which
// for a UUIDv7 parent is the parent's timestamp, so the derived ID sorts and
// partitions by the time of its cause, and TimeOf(DerivedID(p, n)) equals
// TimeOf(p). A parent that is not a UUIDv7 (the UUIDv5 StepID falls back to)
// still gives a deterministic result, but its first 48 bits are then hash
// bits that TimeOf reports as a time (any time from 1970 to the year 10889):
// storage that files rows by that time (the inbox's partition mode) files
// such an ID under an arbitrary day, almost always the DEFAULT partition.
//
// Use a distinct name for each event a handler emits from one parent. The
// nil UUID has no derived IDs: DerivedID(uuid.Nil, name) is uuid.Nil, which
// Validate refuses (every derived ID of an unset parent would otherwise be
// one and the same, and an outbox would keep only the first such event).
func DerivedID(parent uuid.UUID, name string) uuid.UUID {
	if parent == uuid.Nil {
		return uuid.Nil
	}
	var id uuid.UUID
	copy(id[:6], parent[:6])
	fillHash(&id, domainDerived, parent[:], []byte(name))
	return id
}

// StepIDAt returns the ID of saga step step of saga sagaID, as a UUIDv7 whose
// timestamp is t (millisecond precision). t must be stable across retries:
// pass the saga's persisted start time, never time.Now. The same three inputs
// always give the same ID; two steps of one saga differ in their random-looking
// bits and share the timestamp.
//
// Times before the Unix epoch are clamped to it, times after the 48-bit range
// (year 10889) to its end.
func StepIDAt(sagaID, step string, t time.Time) uuid.UUID {
	var id uuid.UUID
	putUnixMilli(&id, clampMilli(t.UnixMilli()))
	fillHash(&id, domainStep, []byte(sagaID), []byte(step))
	return id
}

// StepID returns the deterministic ID of saga step step of saga sagaID
// (rule R-DIST-IDEM-1: a saga step is identified by sagaId + stepName).
//
// When sagaID is the text of a UUIDv7 (the recommended way to create saga
// IDs), StepID is StepIDAt(sagaID, step, t) with t the saga ID's own
// timestamp: a UUIDv7 that sorts by the saga's start.
//
// Otherwise there is no time to embed, and StepID returns a name-based UUIDv5
// (SHA-1 in Namespace over the length-prefixed saga ID and step name). It
// deliberately does not invent a timestamp: a fake time (zero, or hash bits)
// would make TimeOf lie, and storage that partitions or expires rows by the
// time in the ID would file the row under the wrong day and could drop it
// while it is still needed for deduplication. The UUIDv5 is as unique and
// deterministic, but does not sort by time and TimeOf reports false for it.
// Callers that want a UUIDv7 anyway use StepIDAt with the saga's start time.
func StepID(sagaID, step string) uuid.UUID {
	if sid, err := uuid.Parse(sagaID); err == nil {
		if t, ok := TimeOf(sid); ok {
			return StepIDAt(sagaID, step, t)
		}
	}
	return uuid.NewSHA1(namespace, hashInput(domainStep, []byte(sagaID), []byte(step)))
}

// fillHash fills bytes 6..15 of id from SHA-256(namespace, domain, parts) and
// sets the version 7 and RFC 4122 variant bits. Bytes 0..5 (the timestamp)
// are left as the caller set them.
func fillHash(id *uuid.UUID, domain string, parts ...[]byte) {
	h := sha256.New()
	h.Write(namespace[:])
	h.Write(hashInput(domain, parts...))
	sum := h.Sum(nil)
	copy(id[6:], sum[:10])
	id[6] = 0x70 | id[6]&0x0f // version 7
	id[8] = 0x80 | id[8]&0x3f // variant 10 (RFC 4122)
}

// hashInput encodes domain and parts unambiguously: each is preceded by its
// length as a uvarint, so ("ab", "c") and ("a", "bc") differ.
func hashInput(domain string, parts ...[]byte) []byte {
	n := len(domain) + binary.MaxVarintLen64
	for _, p := range parts {
		n += len(p) + binary.MaxVarintLen64
	}
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(len(domain)))
	b = append(b, domain...)
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

func unixMilliOf(id uuid.UUID) int64 {
	var b [8]byte
	copy(b[2:], id[:6])
	return int64(binary.BigEndian.Uint64(b[:]))
}

func putUnixMilli(id *uuid.UUID, ms int64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(ms))
	copy(id[:6], b[2:])
}

func clampMilli(ms int64) int64 {
	switch {
	case ms < 0:
		return 0
	case ms > maxUnixMilli:
		return maxUnixMilli
	}
	return ms
}
