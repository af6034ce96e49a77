package idemkafka_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// A dead letter is stamped when it is dead-lettered, the original's
// timestamp going to HeaderDLQTimestamp (replacing one the original
// carried): with the original's timestamp, the dead letter of an old event
// could be deleted by the topic's time retention within minutes, or
// refused by a broker bounding timestamps in the past.
func TestDeadLetterTimestamp(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	group := kafkatest.Name("g")
	old := time.Now().Add(-30 * 24 * time.Hour).Truncate(time.Millisecond)
	kc.Produce(t, topic, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("not an event"), Timestamp: old,
		Headers: []kgo.RecordHeader{{Key: idemkafka.HeaderDLQTimestamp, Value: []byte("1")}}})
	before := time.Now().Add(-time.Second) // the broker's clock is this one
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "committed", func() bool { return allCommitted(t, kc, group, topic) }) // 4 s were too few on a busy machine
	mustStop(t, inst)
	rs := kc.Records(t, dlq)
	if len(rs) != 1 {
		t.Fatalf("%d dead letters; want 1", len(rs))
	}
	dl := rs[0]
	if dl.Timestamp.Before(before) {
		t.Errorf("dead letter stamped %s; want the time it was dead-lettered (after %s), not the original's %s", dl.Timestamp, before, old)
	}
	if n := headerCount(dl, idemkafka.HeaderDLQTimestamp); n != 1 {
		t.Fatalf("%d %s headers; want 1", n, idemkafka.HeaderDLQTimestamp)
	}
	if got, want := header(dl, idemkafka.HeaderDLQTimestamp), strconv.FormatInt(old.UnixMilli(), 10); got != want {
		t.Errorf("%s = %q; want the original's timestamp %q", idemkafka.HeaderDLQTimestamp, got, want)
	}
}
