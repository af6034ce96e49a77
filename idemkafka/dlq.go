package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
)

// Headers added to a dead-lettered copy of a record. The copy keeps the
// original key, value and headers (so its event ID too: a consumer that
// re-drives the dead-letter topic deduplicates as usual); headers with the
// DLQHeaderPrefix that the original carried (it was dead-lettered before)
// are replaced. The copy's Kafka timestamp is the time it was
// dead-lettered, so that the dead-letter topic's retention counts from
// then (a copy of an old record keeping its timestamp could be deleted at
// once, or refused by a broker that bounds timestamps in the past); the
// original's is in HeaderDLQTimestamp.
const (
	// DLQHeaderPrefix starts every header below.
	DLQHeaderPrefix = "idem-dlq-"
	// HeaderDLQError is the error that made the record a dead letter
	// (at most MaxDLQErrorLen bytes).
	HeaderDLQError = "idem-dlq-error"
	// HeaderDLQTopic, HeaderDLQPartition and HeaderDLQOffset locate the
	// original record (partition and offset in decimal).
	HeaderDLQTopic     = "idem-dlq-topic"
	HeaderDLQPartition = "idem-dlq-partition"
	HeaderDLQOffset    = "idem-dlq-offset"
	// HeaderDLQConsumer is the inbox consumer name that gave up on it.
	HeaderDLQConsumer = "idem-dlq-consumer"
	// HeaderDLQAttempts is how many times the handler was tried (0 for a
	// record that could not be decoded), in decimal.
	HeaderDLQAttempts = "idem-dlq-attempts"
	// HeaderDLQTimestamp is the original record's Kafka timestamp, in
	// milliseconds since the Unix epoch, in decimal (as Kafka stores it).
	HeaderDLQTimestamp = "idem-dlq-timestamp"
	// HeaderDLQTruncated, on a dead letter without a value, is the size of
	// the original value in bytes: the copy with it was too large for the
	// dead-letter topic (or the client's ProducerBatchMaxBytes), so the
	// dead letter points at the original (topic, partition, offset), which
	// stays in its topic until its retention ends.
	HeaderDLQTruncated = "idem-dlq-truncated"
)

// MaxDLQErrorLen bounds the HeaderDLQError value, in bytes.
const MaxDLQErrorLen = 4096

// dlqTimeout bounds the wait for a dead letter's acknowledgement. kgo does
// not abandon a produce it has written (idempotent writes wait until its
// outcome is known, retrying a broker's retriable errors without end: a
// dead-letter partition under min.insync.replicas would hold it forever),
// so the consumer stops waiting instead: at this deadline, or when it is
// stopped. The record's offset is not committed, so the partition is
// rewound and the record dead-lettered again later; a copy given up on may
// still be appended, so the dead-letter topic can hold a record twice (the
// same idem event ID).
const dlqTimeout = 30 * time.Second

// ErrPoison marks a handler error that retrying cannot fix: a record whose
// handler returns an error wrapping ErrPoison (or panics with such an error)
// is dead-lettered at once, without the remaining Retry.Attempts. It is
// event.ErrPoison (the same value as outbox.ErrPoison); handlers may return
// either.
var ErrPoison = event.ErrPoison

// deadLetter returns the dead-letter copy of r for topic.
func deadLetter(topic string, r *kgo.Record, consumer string, attempts int, cause error, now time.Time) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+7)
	for _, h := range r.Headers {
		if !strings.HasPrefix(h.Key, DLQHeaderPrefix) {
			hs = append(hs, h)
		}
	}
	msg := "unknown error"
	if cause != nil {
		msg = cause.Error()
	}
	if len(msg) > MaxDLQErrorLen {
		msg = strings.ToValidUTF8(msg[:MaxDLQErrorLen], "")
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderDLQError, Value: []byte(msg)},
		kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDLQPartition, Value: strconv.AppendInt(nil, int64(r.Partition), 10)},
		kgo.RecordHeader{Key: HeaderDLQOffset, Value: strconv.AppendInt(nil, r.Offset, 10)},
		kgo.RecordHeader{Key: HeaderDLQConsumer, Value: []byte(consumer)},
		kgo.RecordHeader{Key: HeaderDLQAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
		kgo.RecordHeader{Key: HeaderDLQTimestamp, Value: strconv.AppendInt(nil, r.Timestamp.UnixMilli(), 10)},
	)
	// Stamped now, not with the original's timestamp: retention by time
	// deletes a segment by its newest timestamp, so a copy of an old
	// record could be deleted within minutes.
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: hs, Timestamp: now}
}

// truncated returns dl without its value, with HeaderDLQTruncated.
func truncated(dl *kgo.Record) *kgo.Record {
	hs := append(slices.Clip(dl.Headers), kgo.RecordHeader{Key: HeaderDLQTruncated, Value: strconv.AppendInt(nil, int64(len(dl.Value)), 10)})
	return &kgo.Record{Topic: dl.Topic, Key: dl.Key, Headers: hs, Timestamp: dl.Timestamp}
}

// tooLarge reports whether err says a record (or its batch) was too large
// for the broker or the client.
func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// sendDeadLetter produces the dead-letter copy of r and waits until the
// broker acknowledged it (acks=all, idempotent: checked at construction).
// Only then may r's offset be committed. It waits at most dlqTimeout, and
// no longer than ctx (the consumer's run) lasts; the produce itself runs
// under work, which outlives a stop.
func (c *Consumer[TTx]) sendDeadLetter(ctx, work context.Context, cl *kgo.Client, r *kgo.Record, attempts int, cause error) error {
	topic := c.cfg.deadLetterTopic(r.Topic)
	dl := deadLetter(topic, r, c.in.Consumer(), attempts, cause, time.Now())
	err := c.produceDeadLetter(ctx, work, cl, dl)
	if tooLarge(err) {
		// Retrying the same copy would fail for ever and stall the
		// partition: send it without its value, pointing at the original.
		c.cfg.Logger.Error("idemkafka: dead letter too large; sending it without its value (the original stays in its topic)",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "bytes", len(r.Value), "err", err)
		dl = truncated(dl)
		err = c.produceDeadLetter(ctx, work, cl, dl)
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("idemkafka: dead-letter %s/%d@%d to %s: %w: %w", r.Topic, r.Partition, r.Offset, topic, missingTopic(topic, false), err)
	}
	if err != nil {
		return fmt.Errorf("idemkafka: dead-letter %s/%d@%d to %s: %w", r.Topic, r.Partition, r.Offset, topic, err)
	}
	c.cfg.Logger.Warn("idemkafka: record dead-lettered",
		"topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
		"dlq_topic", topic, "dlq_partition", dl.Partition, "dlq_offset", dl.Offset,
		"attempts", attempts, "err", cause)
	return nil
}

// produceDeadLetter produces dl and waits for its acknowledgement (see
// sendDeadLetter).
func (c *Consumer[TTx]) produceDeadLetter(ctx, work context.Context, cl *kgo.Client, dl *kgo.Record) error {
	pctx, cancel := context.WithTimeout(work, dlqTimeout) // bounds a Produce blocked on a full buffer
	defer cancel()
	acked := make(chan error, 1) // a late acknowledgement does not block kgo
	cl.Produce(pctx, dl, func(_ *kgo.Record, err error) { acked <- err })
	timer := time.NewTimer(dlqTimeout)
	defer timer.Stop()
	var err error
	select {
	case err = <-acked:
	case <-timer.C:
		err = fmt.Errorf("not acknowledged within %s", dlqTimeout)
	case <-ctx.Done():
		err = fmt.Errorf("not acknowledged when the consumer stopped: %w", ctx.Err())
	}
	return err
}
