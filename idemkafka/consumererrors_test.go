package idemkafka_test

import (
	"database/sql"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// The group's committed offset is below the partition's log start: the
// records from it were deleted by retention before the group consumed them
// (the consumer was down longer than retention.ms). kgo's fetch answers
// OFFSET_OUT_OF_RANGE and kgo resumes at the log start (ConsumeResetOffset,
// the start by default) without telling: the deleted records were skipped
// with no log line. The consumer now says so at ERROR, naming the partition
// and the offset the group was at, and counts it (Consumer.OffsetResets);
// the records still there are applied once, those applied before are not
// applied again.
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
	var c *idemkafka.Consumer[*sql.Tx]
	c2 := start(t, b, "billing", cfg, func(cc *idemkafka.Consumer[*sql.Tx]) { c = cc })
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
	if n := c.OffsetResets(); n != 1 {
		t.Errorf("OffsetResets %d; want 1", n)
	}
	if !strings.Contains(warn, "level=ERROR") || !strings.Contains(warn, "topic="+topic) || !strings.Contains(warn, "prior_offset=10") {
		t.Errorf("no ERROR names the partition and the offset the group was at (10); logs:\n%s", logs.String())
	}
	if !strings.Contains(own.String(), "OFFSET_OUT_OF_RANGE") {
		t.Errorf("the kgo.WithLogger given in ExtraOpts did not get kgo's line; it got:\n%s", own.String())
	}
	t.Logf("applied %d events; skipped 5 deleted by retention; the line: %s", distinct(t, b, "billing"), warn)
}

// The group coordinator refuses the offset commits for 5s with the errors
// a real cluster gives while the coordinator moves or the group
// rebalances (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
// REBALANCE_IN_PROGRESS), then accepts them: every event is applied once,
// the offsets reach the end without a restart, the failures are logged
// without a flood, and a consumer started afterwards applies nothing
// again. (kgo retries a commit refused so until it succeeds or the
// consumer's commitTimeout, 30s, ends: the consumer applies nothing more
// meanwhile, so the events wait for the coordinator, logged.)
func TestOffsetCommitCoordinatorErrors(t *testing.T) {
	t.Parallel()
	for _, code := range []*kerr.Error{kerr.CoordinatorNotAvailable, kerr.NotCoordinator, kerr.RebalanceInProgress} {
		t.Run(code.Message, func(t *testing.T) {
			t.Parallel()
			b := setupSQLite(t)
			kc := kafkatest.New(t)
			fake := kc.Fake(t)
			topic := kc.Topic(t, "orders", 2)
			group := kafkatest.Name("g")
			fault := fake.Fault(kfakeFault(kmsg.OffsetCommit, "", code, -1))
			var logs testlog.Buffer
			cfg := consumerConfig(kc, b, "billing", group, nil, topic)
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			c := start(t, b, "billing", cfg)
			began := time.Now()
			healed := time.AfterFunc(5*time.Second, fault.Remove)
			defer healed.Stop()
			evs := newEvents(t, 40, 8)
			for i := 0; i < len(evs); i += 10 {
				kc.Produce(t, topic, recordsOf(topic, evs[i:i+10]...)...)
				time.Sleep(200 * time.Millisecond)
			}
			waitFor(t, 60*time.Second, "every event applied", func() bool { return distinct(t, b, "billing") == len(evs) })
			applied := time.Since(began)
			waitFor(t, 60*time.Second, "the offsets committed once the coordinator accepts", func() bool { return allCommitted(t, kc, group, topic) })
			mustStop(t, c)
			if fault.Hits() == 0 {
				t.Fatal("no offset commit refused")
			}
			mustOnce(t, b, "billing", evs)
			warns, _ := logLines(logs.String(), "WARN", "")
			errs, _ := logLines(logs.String(), "ERROR", "")
			t.Logf("%s for 5s: %d commits refused, %d WARN and %d ERROR lines; the 40 events applied %s after the first was produced",
				code.Message, fault.Hits(), warns, errs, applied.Round(time.Millisecond))
			if warns+errs > 10 {
				t.Errorf("%d WARN and %d ERROR lines; want a few; logs:\n%s", warns, errs, logs.String())
			}

			again := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
			kc.Produce(t, topic, recordsOf(topic, newEvents(t, 1, 1)...)...)
			waitFor(t, 30*time.Second, "a new event applied", func() bool { return distinct(t, b, "billing") == len(evs)+1 })
			mustStop(t, again)
			if s := again.stats.get(); s.applied != 1 || s.duplicates != 0 {
				t.Errorf("the next consumer applied %d and skipped %d; want 1 and 0 (the offsets were committed)", s.applied, s.duplicates)
			}
		})
	}
}
