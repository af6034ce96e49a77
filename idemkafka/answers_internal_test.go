package idemkafka

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// The answers read from kgo's "produced" lines (the format of kgo's
// sink.go): an error answer is kept per partition, a written batch forgets
// it, and what is not an answer (a batch skipped, a partition moved, a
// line in another format) changes nothing.
func TestAnswersRead(t *testing.T) {
	t0 := time.Now()
	var a answers
	a.read("pay[1{retrying@0,1(NOT_ENOUGH_REPLICAS: Messages are rejected since there are fewer in-sync replicas than required.)}, 2{3=>5}], "+
		"ord[0{7=>9}, 2{err@4,1(MESSAGE_TOO_LARGE: The request included a message larger than the max message size the server will accept. (uncompressed_bytes=10, compressed_bytes=9))}]", t0)
	a.read("pay[0{retrying@0,2(NOT_LEADER_FOR_PARTITION: This server is not the leader for that topic-partition.)}, 2{skipped@5,1(NOT_ENOUGH_REPLICAS: x)}, 3{move:1:2@0,1}]", t0)
	a.read("garbage[x{", t0)
	a.read("noack pay[4{0=>1}]", t0)

	err := a.forTopic("pay", t0.Add(2*time.Second))
	if !errors.Is(err, kerr.NotEnoughReplicas) || !errors.Is(err, kerr.NotLeaderForPartition) {
		t.Errorf("pay: %v; want it to wrap NOT_ENOUGH_REPLICAS and NOT_LEADER_FOR_PARTITION", err)
	}
	want := "the broker's last answer to the topic's records: partition 0 (2 s ago): " + kerr.NotLeaderForPartition.Error() +
		"; partition 1 (2 s ago): " + kerr.NotEnoughReplicas.Error()
	if err == nil || err.Error() != want {
		t.Errorf("pay: %v;\nwant %s", err, want)
	}
	err = a.forTopic("ord", t0)
	if !errors.Is(err, kerr.MessageTooLarge) || err == nil || !strings.HasSuffix(err.Error(), "(uncompressed_bytes=10, compressed_bytes=9)") {
		t.Errorf("ord: %v; want MESSAGE_TOO_LARGE with kgo's sizes", err)
	}

	// Partition 1 writes again, partition 0 answers the same as 2: one
	// group.
	a.read("pay[1{5=>6}], pay[2{retrying@0,1(NOT_LEADER_FOR_PARTITION: This server is not the leader for that topic-partition.)}]", t0.Add(time.Second))
	want = "the broker's last answer to the topic's records: partitions 0, 2 (1 s ago): " + kerr.NotLeaderForPartition.Error()
	if err := a.forTopic("pay", t0.Add(2*time.Second)); err == nil || err.Error() != want || errors.Is(err, kerr.NotEnoughReplicas) {
		t.Errorf("pay: %v;\nwant %s", err, want)
	}
	// A record of partition 0 that a Publish gave up waiting for is
	// written (outcomeHook): its answer is forgotten.
	a.forget("pay", 0)
	want = "the broker's last answer to the topic's records: partition 2 (1 s ago): " + kerr.NotLeaderForPartition.Error()
	if err := a.forTopic("pay", t0.Add(2*time.Second)); err == nil || err.Error() != want {
		t.Errorf("pay: %v;\nwant %s", err, want)
	}
	if err := a.forTopic("pay", t0.Add(answerTTL+2*time.Second)); err != nil {
		t.Errorf("pay after answerTTL: %v; want nil", err)
	}
	if err := a.forTopic("other", t0); err != nil {
		t.Errorf("other: %v; want nil", err)
	}
}
