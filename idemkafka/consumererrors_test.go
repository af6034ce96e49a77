package idemkafka_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// The group's committed offset is below the partition's log start: the
// records from it were deleted by retention before the group consumed them
// (the consumer was down longer than retention.ms). kgo's fetch answers
// OFFSET_OUT_OF_RANGE and kgo resumes at the log start (ConsumeResetOffset,
// the start by default) without telling: the deleted records were skipped
// with no log line. The consumer now says so at WARN, naming the partition
// and the offset the group was at; the records still there are applied
// once, those applied before are not applied again.
func TestConsumerOffsetOutOfRangeLogged(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	first := newEvents(t, 10, 2)
	kc.Produce(t, topic, recordsOf(topic, first...)...)
	c1 := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "the first events committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, c1)

	later := newEvents(t, 10, 2)
	kc.Produce(t, topic, recordsOf(topic, later...)...)
	if err := fake.DeleteRecords(topic, 0, 15); err != nil { // retention: offsets 10 to 14 are gone
		t.Fatal(err)
	}
	var logs testlog.Buffer
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	var own testlog.Buffer // the user's own kgo logger still gets kgo's lines
	cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.WithLogger(kgo.BasicLogger(&own, kgo.LogLevelInfo, nil)))
	c2 := start(t, b, "billing", cfg)
	waitFor(t, 30*time.Second, "the remaining events committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, c2)

	mustOnce(t, b, "billing", append(first, later[5:]...))
	if n := distinct(t, b, "billing"); n != 15 {
		t.Errorf("%d events applied; want 15 (10, then the 5 retention left)", n)
	}
	var warn string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "OFFSET_OUT_OF_RANGE") {
			warn = l
		}
	}
	if !strings.Contains(warn, "level=WARN") || !strings.Contains(warn, "topic="+topic) || !strings.Contains(warn, "prior_offset=10") {
		t.Errorf("no WARN names the partition and the offset the group was at (10); logs:\n%s", logs.String())
	}
	if !strings.Contains(own.String(), "OFFSET_OUT_OF_RANGE") {
		t.Errorf("the kgo.WithLogger given in ExtraOpts did not get kgo's line; it got:\n%s", own.String())
	}
	t.Logf("applied %d events; skipped 5 deleted by retention; the line: %s", distinct(t, b, "billing"), warn)
}
