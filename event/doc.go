// Package event defines the envelope that every idem event travels in, and the
// IDs that make redelivery and retries harmless.
//
// # One ID per business operation
//
// An [Envelope] carries an ID generated once, when the business operation
// happens (rule R-DIST-IDEM-1). The ID is stored with the event in the outbox
// in the same transaction as the business write, and the relay publishes the
// stored envelope as it is: a retry of the publish, a relay restart or a
// redelivery to a consumer all carry the same ID, so the consumer's inbox
// (processed_event) recognises the repeat. Never call [New] again for a retry
// of the same operation (R-DIST-IDEM-X2, R-DIST-IDEM-X3).
//
// IDs are UUIDv7: the first 48 bits are a Unix millisecond timestamp, so IDs
// sort by creation time and B-tree inserts stay sequential.
//
// # Deterministic IDs
//
// Code that re-runs (a saga step retried after a crash, a handler processing a
// redelivered event) must emit the same IDs as the first run, otherwise the
// downstream inbox sees a "new" event. [DerivedID] and [StepID] compute IDs
// from their inputs instead of from a clock or random source:
//
//   - DerivedID(parent, name): an event emitted while handling event parent.
//     The result keeps the parent's 48-bit timestamp, so it is a valid UUIDv7
//     that sorts next to its cause.
//   - StepIDAt(sagaID, step, t): a saga step whose saga has a persisted start
//     time t. The result is a UUIDv7 with t's millisecond timestamp.
//   - StepID(sagaID, step): as StepIDAt with the time taken from sagaID when
//     sagaID is itself a UUIDv7 (recommended: create saga IDs with
//     uuid.NewV7). Otherwise there is no time to embed and StepID returns a
//     name-based UUIDv5 (see [StepID] for why it does not invent a time).
//
// The non-timestamp bits of a deterministic ID are the first 74 bits of a
// SHA-256 over [Namespace], a domain tag and the length-prefixed inputs, with
// the UUIDv7 version and RFC 4122 variant bits set. Distinct inputs collide
// with probability about 2^-74 per pair within one millisecond.
//
// Why version 7 and not 8: RFC 9562 reserves version 8 for custom layouts
// and asks version 7's rand_a and rand_b to be pseudorandom. A derived ID
// keeps version 7's layout exactly (a real Unix millisecond timestamp, then
// bits no one can predict without the inputs: SHA-256 output), so every
// property a reader of a version 7 ID relies on holds: it sorts by time, its
// time can be read back ([TimeOf], and pgdriver's partitioned inbox routes
// rows by it), and it is unique. Stamping it version 8 would make standard
// tools refuse to read its time and would move these events to the inbox's
// default partition; what would be gained is only the label. The one
// difference from a random version 7 ID is on purpose: the same inputs give
// the same ID.
//
// # Kafka mapping
//
// This package does not import a Kafka client. [Envelope.RecordHeaders] and
// [FromRecord] map an envelope to and from a record key (Envelope.Key, the
// aggregate ID, so one aggregate's events stay in one partition and in order),
// a value (Envelope.Payload, JSON) and headers in the tiny [Header] type, which
// converts field for field to kgo.RecordHeader. The ID, type, saga ID and
// occurrence time travel in headers (HeaderEventID and friends), so a consumer
// can deduplicate without parsing the payload.
//
// # CloudEvents headers
//
// [Envelope.RecordHeadersWith] can write the CloudEvents 1.0 Kafka binding's
// binary-mode headers instead of the idem ones ([HeaderFormatCloudEvents]),
// or both ([HeaderFormatBoth]), so that non-Go consumers read the record as a
// CloudEvent: ce_id is the event ID, ce_type the type, ce_time the occurrence
// time, ce_subject and ce_partitionkey the key, ce_idemsagaid the saga ID,
// ce_source the producer given in [HeaderOptions], and content-type
// application/json; the payload is the CloudEvent's data. [FromRecord] reads
// records in any of the formats, with no setting: a record with a
// ce_specversion header is a CloudEvent, its "ce_" headers are not copied to
// Envelope.Headers, and when it also has the idem headers the two sets must
// agree ([ErrHeaderMismatch]). A CloudEvent from another producer is accepted
// when its ce_id is an ID idem accepts (a UUIDv7, or a version-5 UUID as a
// saga step's fallback ID is) and it has ce_type (matching [TypePattern])
// and ce_time.
package event
