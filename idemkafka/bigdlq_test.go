package idemkafka_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// A topic that accepts 5 MB records (max.message.bytes raised, producer with
// a larger ProducerBatchMaxBytes and compression): a 2 MB record that is not
// an idem event is dead-lettered although its copy is too large for the
// consumer's client (it stalled its partition for ever, retrying the copy):
// without its value, pointing at the original; and the partition goes on.
func TestLargePoisonDeadLetteredWithoutValue(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kafkatest.Name("big")
	dlq := topic + ".dlq"
	for _, name := range []string{topic, dlq} {
		kc.CreateTopicConfig(t, name, 1, map[string]string{"max.message.bytes": "5242880"})
	}
	group := kafkatest.Name("g")
	evs := newEvents(t, 2, 1)
	big := &kgo.Record{Topic: topic, Key: []byte("order-0"), Value: bytes.Repeat([]byte("x"), 2<<20)}
	rs := append([]*kgo.Record{big}, recordsOf(topic, evs...)...)
	pcl := kc.Client(t, kgo.ProducerBatchMaxBytes(5<<20), kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	if err := pcl.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	deadline := time.Now().Add(15 * time.Second)
	for !allCommitted(t, kc, group, topic) {
		if time.Now().After(deadline) {
			s := inst.stats.get()
			t.Fatalf("partition stalled: committed %v of %v; batches %d, applied %d, rewound %d; dlq end %v",
				kc.Committed(t, group, topic), kc.EndOffsets(t, topic), s.batches, s.applied, s.rewound, kc.EndOffsets(t, dlq))
		}
		time.Sleep(100 * time.Millisecond)
	}
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
	dead := kc.Records(t, dlq)
	if len(dead) != 1 || len(dead[0].Value) != 0 {
		t.Fatalf("dead letters %d (value %d bytes); want 1 without its value", len(dead), len(dead[0].Value))
	}
	var size string
	for _, h := range dead[0].Headers {
		if h.Key == idemkafka.HeaderDLQTruncated {
			size = string(h.Value)
		}
	}
	if size != "2097152" {
		t.Errorf("%s = %q, want the original's 2097152 bytes", idemkafka.HeaderDLQTruncated, size)
	}
}
