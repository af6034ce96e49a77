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
			topic := kc.Topic(t, "orders", 1)
			kc.CreateTopic(t, topic+idemkafka.DeadLetterSuffix, 1)
			group := kafkatest.Name("g")
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
