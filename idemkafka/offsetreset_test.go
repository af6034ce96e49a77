package idemkafka_test

import (
	"database/sql"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// behindRig is a consumer of a one-partition topic that falls behind: its
// handler blocks on the first event until release, while the topic's
// records from the consumer's fetch position on are deleted (retention,
// kadm's DeleteRecords) under it. kgo fetches one batch at a time
// (FetchMaxBytes 1), and each record is a batch of its own, so the
// consumer's fetch position is a few records in when they are deleted.
type behindRig struct {
	c       *idemkafka.Consumer[*sql.Tx]
	inst    *instance
	logs    *testlog.Buffer
	first   []event.Envelope
	release chan struct{}
}

func startBehind(t *testing.T, b *backend[*sql.Tx], kc *kafkatest.Cluster, topic, group string, opts ...kgo.Opt) *behindRig {
	t.Helper()
	r := &behindRig{logs: &testlog.Buffer{}, first: newEvents(t, 10, 2), release: make(chan struct{})}
	hook := func(e event.Envelope) error {
		if e.ID == r.first[0].ID {
			<-r.release
		}
		return nil
	}
	cfg := consumerConfig(kc, b, "billing", group, hook, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(r.logs, nil))
	cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.FetchMaxBytes(1), kgo.FetchMaxPartitionBytes(1))
	cfg.ExtraOpts = append(cfg.ExtraOpts, opts...)
	for _, rec := range recordsOf(topic, r.first...) {
		kc.Produce(t, topic, rec)
	}
	r.inst = start(t, b, "billing", cfg, func(c *idemkafka.Consumer[*sql.Tx]) { r.c = c })
	t.Cleanup(func() {
		select {
		case <-r.release:
		default:
			close(r.release)
		}
	})
	return r
}

// A consumer behind its partition, whose next records are deleted under
// it (retention while it is slow, an operator's DeleteRecords): kgo's
// fetch answers OFFSET_OUT_OF_RANGE and kgo resumes at the log start, so
// the records in between are never applied. That is data loss for a
// payments consumer: it must be an ERROR naming the partition and the
// offset the consumer was at, and counted (Consumer.OffsetResets, for a
// metric to alert on). It was a WARN, and counted nowhere.
func TestConsumerOffsetOutOfRangeWhileConsuming(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	r := startBehind(t, b, kc, topic, group)
	waitFor(t, 30*time.Second, "the consumer at its first event", func() bool { return strings.Contains(r.logs.String(), "partitions assigned") })
	time.Sleep(time.Second) // the first fetches buffered
	later := newEvents(t, 20, 2)
	for _, rec := range recordsOf(topic, later...) {
		kc.Produce(t, topic, rec)
	}
	if err := fake.DeleteRecords(topic, 0, 20); err != nil {
		t.Fatal(err)
	}
	if n := r.c.OffsetResets(); n != 0 {
		t.Fatalf("OffsetResets %d before the reset", n)
	}
	close(r.release)
	waitFor(t, 30*time.Second, "the records left committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, r.inst)
	applied := distinct(t, b, "billing")
	// The first events fetched before the deletion, then offsets 20 to
	// 29; nothing twice.
	got := counts(b.rows(t, "billing"))
	var want []event.Envelope
	for _, e := range r.first {
		if got[e.ID] > 0 {
			want = append(want, e)
		}
	}
	mustOnce(t, b, "billing", append(want, later[10:]...))
	var line string
	for _, l := range strings.Split(r.logs.String(), "\n") {
		if strings.Contains(l, "OFFSET_OUT_OF_RANGE") {
			line = l
		}
	}
	if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "topic="+topic) || !strings.Contains(line, "partition=0") || !strings.Contains(line, "prior_offset=") {
		t.Errorf("no ERROR names the partition and the offset the consumer was at; logs:\n%s", r.logs.String())
	}
	if n := r.c.OffsetResets(); n != 1 {
		t.Errorf("OffsetResets %d; want 1", n)
	}
	t.Logf("applied %d of 30 (%d deleted unapplied); %s", applied, 30-applied, line)
}

// The same with kgo.ConsumeResetOffset(kgo.NoResetOffset().AtStart()) in
// ExtraOpts, a payments team's choice: the partition stops at the first
// record not applied instead of skipping the deleted ones, and nothing is
// committed past it. kgo then answers every fetch of the partition with
// OFFSET_OUT_OF_RANGE until an operator moves the group's offset: the
// consumer logged each one at ERROR, one line per poll (hundreds a
// second with the tests' 10ms backoff, and at every poll while the
// consumer's other partitions have records): it logs the first, then at
// most one line every 30s while the failures go on.
func TestConsumerNoResetOffsetStopsTheLossLoggedOnce(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	r := startBehind(t, b, kc, topic, group, kgo.ConsumeResetOffset(kgo.NoResetOffset().AtStart()))
	waitFor(t, 30*time.Second, "the consumer at its first event", func() bool { return strings.Contains(r.logs.String(), "partitions assigned") })
	time.Sleep(time.Second) // the first fetches buffered
	later := newEvents(t, 20, 2)
	for _, rec := range recordsOf(topic, later...) {
		kc.Produce(t, topic, rec)
	}
	if err := fake.DeleteRecords(topic, 0, 20); err != nil {
		t.Fatal(err)
	}
	close(r.release)
	waitFor(t, 30*time.Second, "the fetch failure logged", func() bool {
		return strings.Contains(r.logs.String(), "OFFSET_OUT_OF_RANGE")
	})
	time.Sleep(5 * time.Second) // polls go on failing
	mustStop(t, r.inst)
	applied := distinct(t, b, "billing")
	committed := kc.Committed(t, group, topic)[0]
	if applied >= len(r.first) || committed >= 20 {
		t.Errorf("%d events applied, offset %d committed; want the partition stopped before the deleted records (offset < 20)", applied, committed)
	}
	if n := r.c.OffsetResets(); n != 0 {
		t.Errorf("OffsetResets %d; want 0 (nothing skipped)", n)
	}
	errs, oor := logLines(r.logs.String(), "ERROR", "OFFSET_OUT_OF_RANGE")
	t.Logf("%d applied, offset %d committed; %d ERROR lines, %d of them OFFSET_OUT_OF_RANGE", applied, committed, errs, oor)
	if oor == 0 || oor > 2 {
		t.Errorf("%d ERROR lines of OFFSET_OUT_OF_RANGE in 5s; want 1 (or 2)", oor)
	}
}
