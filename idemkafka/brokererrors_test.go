package idemkafka_test

import (
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// newPGRelayRig is a relayRig on PostgreSQL (pgdriver) with the relay's
// and the client's defaults: what a producing service runs in production.
func newPGRelayRig(t *testing.T, kc *kafkatest.Cluster, topic string, cfg outbox.RelayConfig, opts ...kgo.Opt) *relayRig[pgx.Tx] {
	t.Helper()
	testdb.RequirePostgres(t)
	_, schema := testdb.Schema(t, 1)
	drv, err := pgdriver.New(testdb.Pool(t, schema, 8), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	q := `SELECT o.event_id::text, coalesce(p.attempts, 0), p.id IS NULL, coalesce(p.parked_at IS NOT NULL, false), coalesce(p.last_error, '')
		FROM ` + pgx.Identifier{schema, "outbox"}.Sanitize() + ` o LEFT JOIN ` + pgx.Identifier{schema, "outbox_pending"}.Sanitize() + ` p ON p.id = o.id
		ORDER BY o.id`
	r := &relayRig[pgx.Tx]{drv: drv, readRows: func(t *testing.T) []outboxRow {
		rows, err := drv.Pool().Query(t.Context(), q)
		if err == nil {
			defer rows.Close()
		}
		return scanOutboxRows(t, rows, err)
	}}
	r.start(t, kc, topic, cfg, 50*time.Millisecond, opts)
	return r
}

// logLines counts the log lines at level (slog's text "level=WARN") and
// those among them that contain s.
func logLines(logs, level, s string) (atLevel, with int) {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "level="+level) {
			atLevel++
			if strings.Contains(l, s) {
				with++
			}
		}
	}
	return atLevel, with
}

// fakeMetadata makes the cluster answer the Metadata requests for topic
// (alone) as a real cluster does during a fault: each partition as set
// makes it from the one kfake would give (every replica in sync). It
// returns the function that ends it.
func fakeMetadata(t *testing.T, fake *kfake.Cluster, topic string, set func(sp *kmsg.MetadataResponseTopicPartition)) (heal func()) {
	t.Helper()
	addrs := fake.ListenAddrs()
	infos := fake.PartitionInfos(topic)
	ti := fake.TopicInfo(topic)
	var on atomic.Bool
	on.Store(true)
	fake.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		req := kreq.(*kmsg.MetadataRequest)
		if !on.Load() || len(req.Topics) != 1 || req.Topics[0].Topic == nil || *req.Topics[0].Topic != topic {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.MetadataResponse)
		for i, a := range addrs {
			host, port, _ := net.SplitHostPort(a)
			b := kmsg.NewMetadataResponseBroker()
			b.NodeID, b.Host = int32(i), host
			n, _ := strconv.Atoi(port)
			b.Port = int32(n)
			resp.Brokers = append(resp.Brokers, b)
		}
		st := kmsg.NewMetadataResponseTopic()
		st.Topic, st.TopicID = kmsg.StringPtr(topic), ti.TopicID
		for _, pi := range infos {
			sp := kmsg.NewMetadataResponseTopicPartition()
			sp.Partition, sp.Leader, sp.LeaderEpoch = pi.Partition, pi.Leader, pi.Epoch
			for i := range int32(len(addrs)) {
				sp.Replicas = append(sp.Replicas, (pi.Leader+i)%int32(len(addrs)))
			}
			sp.ISR = sp.Replicas
			set(&sp)
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})
	return func() { on.Store(false) }
}

// The partitions' in-sync replicas fall below min.insync.replicas
// (NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND) or their leaders
// are being elected (NOT_LEADER_OR_FOLLOWER, the metadata without leaders)
// for several seconds, then the cluster heals: the events stay pending,
// none is marked published that was not written, the relay says why at
// WARN without a flood (kgo retries these errors without telling them: the
// relay logged "context deadline exceeded"), and every event is published
// once the cluster heals, once, each key in order.
func TestRelayBrokerRetriableProduceErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code *kerr.Error
		want string // in the WARN line
		meta func(sp *kmsg.MetadataResponseTopicPartition)
	}{
		{kerr.NotEnoughReplicas, "NOT_ENOUGH_REPLICAS", func(sp *kmsg.MetadataResponseTopicPartition) { sp.ISR = sp.Replicas[:1] }},
		{kerr.NotEnoughReplicasAfterAppend, "NOT_ENOUGH_REPLICAS", func(sp *kmsg.MetadataResponseTopicPartition) { sp.ISR = sp.Replicas[:1] }},
		{kerr.NotLeaderForPartition, "LEADER_NOT_AVAILABLE", func(sp *kmsg.MetadataResponseTopicPartition) {
			sp.Leader, sp.ErrorCode = -1, kerr.LeaderNotAvailable.Code
		}},
	} {
		code := tc.code
		t.Run(code.Message, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.New(t, kfake.NumBrokers(3))
			fake := kc.Fake(t)
			topic := kc.Topic(t, "orders", 3)
			r := newPGRelayRig(t, kc, topic, outbox.RelayConfig{PublishTimeout: 3 * time.Second})
			first := newEvents(t, 30, 6)
			r.enqueue(t, first...)
			r.run(t)
			waitFor(t, 30*time.Second, "the first events published", func() bool { p, _, _ := r.count(t); return p == len(first) })

			heal := fakeMetadata(t, fake, topic, tc.meta)
			fault := fake.Fault(kfakeFault(kmsg.Produce, topic, code, -1))
			evs := newEvents(t, 60, 6)
			r.enqueue(t, evs...)
			time.Sleep(8 * time.Second) // the fault: longer than PublishTimeout
			if fault.Hits() == 0 && code != kerr.NotLeaderForPartition {
				t.Fatal("the fault never hit")
			}
			published, parked, failed := r.count(t)
			var written int64
			for _, pi := range fake.PartitionInfos(topic) {
				written += pi.HighWatermark
			}
			// The broker answers NOT_ENOUGH_REPLICAS_AFTER_APPEND after it
			// wrote the records: written, though not acknowledged.
			if published != len(first) || written < int64(published) || parked != 0 {
				t.Errorf("during the fault: %d marked published, %d records written, %d parked; want only the %d before it, none parked",
					published, written, parked, len(first))
			}
			during := r.logs.String()
			fault.Remove()
			heal()
			if code == kerr.NotLeaderForPartition {
				// The election's outcome: the leaders moved.
				for p := range int32(3) {
					if err := fake.MoveTopicPartition(topic, p, (fake.LeaderFor(topic, p)+1)%3); err != nil {
						t.Fatal(err)
					}
				}
			}
			start := time.Now()
			waitFor(t, 60*time.Second, "all published after the heal", func() bool { p, _, _ := r.count(t); return p == len(first)+len(evs) })
			healed := time.Since(start)
			r.stop()
			mustPublished(t, kc.Records(t, topic), append(first, evs...))
			if _, parked, _ := r.count(t); parked != 0 {
				t.Errorf("%d events parked", parked)
			}
			warns, named := logLines(during, "WARN", tc.want)
			errs, _ := logLines(during, "ERROR", "")
			t.Logf("%s: %d produce requests refused, %d records written and %d events marked published during the fault, %d events failed once or more, %d WARN lines (%d naming %q), %d ERROR lines during 8s; all published %s after the heal",
				code.Message, fault.Hits(), written, published, failed, warns, named, tc.want, errs, healed.Round(time.Millisecond))
			if named == 0 {
				t.Errorf("no WARN line names %q; logs during the fault:\n%s", tc.want, during)
			}
			if warns > 10 || errs > 0 {
				t.Errorf("%d WARN and %d ERROR lines in 8s of fault; want a few WARN lines, no ERROR flood; logs:\n%s", warns, errs, during)
			}
		})
	}
}
