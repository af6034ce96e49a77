package idemkafka

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
)

// Headers added to a dead-lettered copy of a record. The copy keeps the
// original key, value and headers (so its event ID too: a consumer that
// re-drives the dead-letter topic deduplicates as usual); headers with the
// DLQHeaderPrefix that the original carried (it was dead-lettered before)
// are replaced.
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
)

// MaxDLQErrorLen bounds the HeaderDLQError value, in bytes.
const MaxDLQErrorLen = 4096

// dlqTimeout bounds the wait for a dead letter's acknowledgement. A produce
// the broker may have appended is not abandoned by kgo at this deadline
// (idempotent writes wait until its outcome is known); an error here only
// means the partition is rewound and the record tried again later.
const dlqTimeout = 30 * time.Second

// ErrPoison marks a handler error that retrying cannot fix: a record whose
// handler returns an error wrapping ErrPoison (or panics with such an error)
// is dead-lettered at once, without the remaining Retry.Attempts. It is
// event.ErrPoison (the same value as outbox.ErrPoison); handlers may return
// either.
var ErrPoison = event.ErrPoison

// deadLetter returns the dead-letter copy of r for topic.
func deadLetter(topic string, r *kgo.Record, consumer string, attempts int, cause error) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+6)
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
	)
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: hs}
}

// sendDeadLetter produces the dead-letter copy of r and waits until the
// broker acknowledged it (acks=all, idempotent: checked at construction).
// Only then may r's offset be committed.
func (c *Consumer[TTx]) sendDeadLetter(ctx context.Context, cl *kgo.Client, r *kgo.Record, attempts int, cause error) error {
	topic := c.cfg.deadLetterTopic(r.Topic)
	dl := deadLetter(topic, r, c.in.Consumer(), attempts, cause)
	ctx, cancel := context.WithTimeout(ctx, dlqTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
		return fmt.Errorf("idemkafka: dead-letter %s/%d@%d to %s: %w", r.Topic, r.Partition, r.Offset, topic, err)
	}
	c.cfg.Logger.Warn("idemkafka: record dead-lettered",
		"topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
		"dlq_topic", topic, "dlq_partition", dl.Partition, "dlq_offset", dl.Offset,
		"attempts", attempts, "err", cause)
	return nil
}
