package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// idemd_kafka_consumer_lag is the number of records of the topic a group
// has not consumed: all of them for a group that never committed, none
// once its consumer committed what it read, the new ones produced while
// it is stopped. A measurement that fails keeps the last values, counts
// in idemd_kafka_consumer_lag_failures_total and is logged once.
func TestConsumerLagMetric(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	topic := cluster.Topic(t, "idemd-lag", EmbeddedPartitions)
	consumed, idle := kafkatest.Name("idemd-lag-consumed"), kafkatest.Name("idemd-lag-idle")
	m := newMetrics()
	logs := &testlog.Buffer{}
	lc := &lagChecker{adm: cluster.Admin(), topic: topic, groups: []string{consumed, idle}, m: m, log: slog.New(slog.NewJSONHandler(logs, nil))}
	produce := func(n int) {
		t.Helper()
		rs := make([]*kgo.Record, n)
		for i := range rs {
			rs[i] = &kgo.Record{Key: []byte(fmt.Sprintf("order-%d-%d", time.Now().UnixNano(), i)), Value: []byte("{}")}
		}
		cluster.Produce(t, topic, rs...)
	}
	lag := func(group string) float64 { return testutil.ToFloat64(m.groupLag.WithLabelValues(group)) }
	want := func(when string, wantConsumed, wantIdle float64) {
		t.Helper()
		lc.check(context.Background())
		if c, i := lag(consumed), lag(idle); c != wantConsumed || i != wantIdle {
			t.Errorf("%s: idemd_kafka_consumer_lag = %v (consumed group), %v (idle group); want %v, %v", when, c, i, wantConsumed, wantIdle)
		}
	}

	want("empty topic", 0, 0)
	produce(7)
	want("7 records, no consumer yet", 7, 7)

	// The consumer reads everything and commits: its group drains to 0.
	cl := cluster.Client(t, kgo.ConsumerGroup(consumed), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for n := 0; n < 7; {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("poll: %v", err)
		}
		n += fs.NumRecords()
	}
	if err := cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	want("consumed and committed", 0, 7)

	// Its consumer stopped, new records wait.
	produce(5)
	want("5 records produced while the consumer is stopped", 5, 12)
	if n := testutil.ToFloat64(m.lagFailures.WithLabelValues(consumed)); n != 0 {
		t.Errorf("lag failures = %v after successful measurements; want 0", n)
	}

	// The broker does not answer: the gauges keep their values.
	dead, err := kgo.NewClient(kgo.SeedBrokers(cluster.Seeds...))
	if err != nil {
		t.Fatal(err)
	}
	dead.Close()
	lc.adm = kadm.NewClient(dead)
	lc.check(context.Background())
	lc.check(context.Background())
	if c, i := lag(consumed), lag(idle); c != 5 || i != 12 {
		t.Errorf("after failed measurements: lag %v, %v; want the last values 5, 12", c, i)
	}
	for _, g := range []string{consumed, idle} {
		if n := testutil.ToFloat64(m.lagFailures.WithLabelValues(g)); n != 2 {
			t.Errorf("idemd_kafka_consumer_lag_failures_total{group=%q} = %v; want 2", g, n)
		}
	}
	if n := strings.Count(logs.String(), "kafka: consumer lag unknown"); n != 1 {
		t.Errorf("%d warnings for two failed measurements; want 1:\n%s", n, logs)
	}
	lc.adm = cluster.Admin()
	want("the broker back", 5, 12)
	if !strings.Contains(logs.String(), "kafka: consumer lag known again") {
		t.Errorf("no line says the lag is known again:\n%s", logs)
	}
}
