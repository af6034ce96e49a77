package idemkafka_test

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// The producer's principal lacks an ACL: IDEMPOTENT_WRITE on the cluster
// (idempotent producers need it on Kafka before 2.8: InitProducerID and
// Produce answer CLUSTER_AUTHORIZATION_FAILED), or WRITE on the topic
// (TOPIC_AUTHORIZATION_FAILED). Nothing is published or marked, nothing is
// parked, the relay's log names the permission to grant, without a flood,
// and every event is published, in order, once it is granted.
func TestRelayDeniedNamesPermission(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		faults []kfake.Fault
		want   []string // in the log and in last_error
	}{
		{"cluster", []kfake.Fault{
			{Keys: []kmsg.Key{kmsg.InitProducerID}, Err: kerr.ClusterAuthorizationFailed, Count: -1},
			{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.ClusterAuthorizationFailed, Count: -1},
		}, []string{"CLUSTER_AUTHORIZATION_FAILED", "IDEMPOTENT_WRITE"}},
		{"topic", []kfake.Fault{
			{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.TopicAuthorizationFailed, Count: -1},
		}, []string{"TOPIC_AUTHORIZATION_FAILED", "WRITE and DESCRIBE on topic"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.New(t)
			fake := kc.Fake(t)
			topic := kc.Topic(t, "orders", 3)
			fault := fake.Fault(tc.faults...)
			r := newPGRelayRig(t, kc, topic, outbox.RelayConfig{}, kgo.MetadataMinAge(50*time.Millisecond))
			evs := newEvents(t, 60, 6)
			r.enqueue(t, evs...)
			r.run(t)
			waitFor(t, 30*time.Second, "every key's head failed 3 times", func() bool { return r.failedAtLeast(t, 3) == 6 })
			time.Sleep(2 * time.Second)
			published, parked, failed := r.count(t)
			var written int64
			for _, pi := range fake.PartitionInfos(topic) {
				written += pi.HighWatermark
			}
			if published != 0 || parked != 0 || written != 0 {
				t.Fatalf("with the ACL missing: %d published, %d parked, %d records written; want none", published, parked, written)
			}
			attempts := 0
			for _, o := range r.rows(t) {
				attempts += o.Attempts
				for _, w := range tc.want {
					if o.Attempts > 0 && !strings.Contains(o.LastError, w) {
						t.Errorf("event %s: last_error %q; want it to name %s", o.EventID, o.LastError, w)
					}
				}
			}
			logs := r.logs.String()
			lines := strings.Count(logs, "\n")
			for _, w := range tc.want {
				if !strings.Contains(logs, w) {
					t.Errorf("no log line names %s; logs:\n%s", w, logs)
				}
			}
			if lines > 10 {
				t.Errorf("%d log lines for %d failed attempts; want a few; logs:\n%s", lines, attempts, logs)
			}
			fault.Remove()
			waitFor(t, 30*time.Second, "all published once the ACL is granted", func() bool { p, _, _ := r.count(t); return p == len(evs) })
			r.stop()
			mustPublished(t, kc.Records(t, topic), evs)
			warns, _ := logLines(logs, "WARN", "")
			errs, _ := logLines(logs, "ERROR", "")
			t.Logf("%s denied: %d failed attempts of %d keys' heads, %d WARN and %d ERROR lines while denied; first line:\n%s",
				tc.name, attempts, failed, warns, errs, strings.SplitN(logs, "\n", 2)[0])
		})
	}
}
