package idemkafka_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testlog"
)

// Offset commits the group refuses, N in a row, while the consumer runs:
// the lines an on-call engineer reads. A commit refused because the group
// is rebalancing (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION,
// UNKNOWN_MEMBER_ID) is routine in Kafka: no WARN, each was one before. Any
// other refusal repeats every second (the pending commit's retry) for as
// long as it lasts: the first is a WARN, its repeats at most one line per
// 30 s, and the commit that succeeds again ends it with an INFO line. In
// every case the offsets are committed in the end, each record applied
// once.
func TestOffsetCommitRefusalsLogged(t *testing.T) {
	t.Parallel()
	const refusals = 5
	for _, c := range []struct {
		err      *kerr.Error
		wantWarn int
	}{
		{kerr.RebalanceInProgress, 0},
		{kerr.IllegalGeneration, 0},
		{kerr.UnknownServerError, 1},
	} {
		t.Run(c.err.Message, func(t *testing.T) {
			t.Parallel()
			b := setupSQLite(t)
			kc := kafkatest.New(t)
			fake := kc.Fake(t)
			topic, group := consumedTopic(t, kc, 1)
			evs := newEvents(t, 10, 2)
			kc.Produce(t, topic, recordsOf(topic, evs...)...)

			fault := fake.Fault(kfakeFault(kmsg.OffsetCommit, "", c.err, refusals))
			logs := &testlog.Buffer{}
			cfg := consumerConfig(kc, b, "billing", group, nil, topic)
			cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
			inst := start(t, b, "billing", cfg)
			waitFor(t, 30*time.Second, "every event applied", func() bool { return distinct(t, b, "billing") == len(evs) })
			waitFor(t, 30*time.Second, "the offsets committed after the refusals", func() bool { return allCommitted(t, kc, group, topic) })
			mustStop(t, inst)
			if got := fault.Hits(); got != refusals {
				t.Fatalf("%d commits refused; want %d", got, refusals)
			}
			mustOnce(t, b, "billing", evs)
			warn, commitWarn := logLines(logs.String(), "WARN", "offset commit")
			if commitWarn != c.wantWarn || warn != commitWarn {
				t.Errorf("%d WARN lines (%d about offset commits) for %d refusals with %s; want %d, all about offset commits:\n%s",
					warn, commitWarn, refusals, c.err.Message, c.wantWarn, logs)
			}
			if _, errs := logLines(logs.String(), "ERROR", ""); errs != 0 {
				t.Errorf("%d ERROR lines; want none:\n%s", errs, logs)
			}
			if c.wantWarn > 0 && !strings.Contains(logs.String(), "offset commits succeed again") {
				t.Errorf("no line ended the commit failures:\n%s", logs)
			}
		})
	}
}

// A consumer stopped while its offset commit waits for a group
// coordinator that does not answer (COORDINATOR_NOT_AVAILABLE, which kgo
// retries for its retry timeout, 30 s by default, as it does a coordinator
// it cannot reach) returns within stopCommitGrace of the stop, with kgo's
// defaults: it waited the whole 30 s, longer than idemd's whole shutdown
// (15 s), which then gave up on the consumers with a WARN. The commit is
// harmless to lose: the next owner gets the records again and its inbox
// skips them.
func TestStopDuringCoordinatorOutageIsBounded(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 6, 2)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	fault := fake.Fault(kfakeFault(kmsg.OffsetCommit, "", kerr.CoordinatorNotAvailable, -1))
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "every event applied", func() bool { return distinct(t, b, "billing") == len(evs) })
	waitFor(t, 10*time.Second, "an offset commit refused", func() bool { return fault.Hits() > 0 })
	watch := stallmeter.Start(t) // seconds without CPU are the machine's
	stopped := time.Now()
	inst.cancel()
	select {
	case err := <-inst.done:
		close(inst.done)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60s of the stop")
	}
	if took, bound := time.Since(stopped), idemkafka.StopCommitGrace+2*time.Second+watch.Stop(); took > bound {
		t.Errorf("Run returned %s after the stop, its commit waiting for the coordinator; want at most %s (the grace, 2 s and the process's stalls)", took.Round(time.Millisecond), bound)
	}
	fault.Remove()
	mustOnce(t, b, "billing", evs)

	again := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "every partition committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, again)
	mustOnce(t, b, "billing", evs)
	if s := again.stats.get(); s.applied != 0 || s.duplicates != len(evs) {
		t.Errorf("second consumer applied %d, skipped %d; want 0 and %d", s.applied, s.duplicates, len(evs))
	}
}
