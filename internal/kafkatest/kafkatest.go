// Package kafkatest gives tests a Kafka cluster: by default a private
// franz-go kfake cluster listening on real TCP ports of 127.0.0.1, or the
// real cluster whose seed brokers IDEM_TEST_KAFKA_SEEDS names (comma
// separated), so every test that uses it also runs against real Kafka.
//
// On a real cluster the tests share the brokers, so topics and groups get
// random names (Topic, Group) and topics are deleted when the test ends.
// Tests that inject broker faults need kfake: they call Fake, which skips
// them on a real cluster.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// EnvSeeds names the environment variable with the seed brokers of a real
// cluster to test against instead of kfake.
const EnvSeeds = "IDEM_TEST_KAFKA_SEEDS"

// Cluster is a Kafka cluster for one test.
type Cluster struct {
	// Seeds are the seed brokers, host:port.
	Seeds []string
	fake  *kfake.Cluster
	admin *kadm.Client
}

// New returns the cluster of IDEM_TEST_KAFKA_SEEDS when it is set (opts are
// then ignored), and otherwise starts a kfake cluster with opts (by default
// one broker, and a group minimum session timeout of 100ms so tests can
// detect a dead member quickly; see SessionTimeout). Everything is closed
// when the test ends.
func New(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	c := &Cluster{}
	if env := os.Getenv(EnvSeeds); env != "" {
		for _, s := range strings.Split(env, ",") {
			if s = strings.TrimSpace(s); s != "" {
				c.Seeds = append(c.Seeds, s)
			}
		}
	} else {
		fake, err := kfake.NewCluster(append([]kfake.Opt{
			kfake.NumBrokers(1),
			kfake.GroupMinSessionTimeout(100 * time.Millisecond),
		}, opts...)...)
		if err != nil {
			t.Fatalf("kafkatest: start kfake: %v", err)
		}
		t.Cleanup(fake.Close)
		c.fake = fake
		c.Seeds = fake.ListenAddrs()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Seeds...))
	if err != nil {
		t.Fatalf("kafkatest: admin client: %v", err)
	}
	t.Cleanup(cl.Close)
	c.admin = kadm.NewClient(cl)
	return c
}

// Real reports whether the cluster is a real one (IDEM_TEST_KAFKA_SEEDS).
func (c *Cluster) Real() bool { return c.fake == nil }

// Fake returns the kfake cluster for fault injection, and skips the test on
// a real cluster.
func (c *Cluster) Fake(t testing.TB) *kfake.Cluster {
	t.Helper()
	if c.fake == nil {
		t.Skipf("needs kfake fault injection; %s is set", EnvSeeds)
	}
	return c.fake
}

// Admin returns an admin client on the cluster.
func (c *Cluster) Admin() *kadm.Client { return c.admin }

// SessionTimeout is a consumer group session timeout the cluster accepts
// that lets a test notice a killed member quickly: 1s on kfake, 6s (the
// usual broker minimum) on a real cluster.
func (c *Cluster) SessionTimeout() time.Duration {
	if c.Real() {
		return 6 * time.Second
	}
	return time.Second
}

// Topic creates a topic with a random name starting with prefix and the
// given number of partitions, and returns its name. It is deleted when the
// test ends.
func (c *Cluster) Topic(t testing.TB, prefix string, partitions int32) string {
	t.Helper()
	name := Name(prefix)
	c.CreateTopic(t, name, partitions)
	return name
}

// CreateTopic creates the named topic (replication factor: the broker's
// default) and deletes it when the test ends.
func (c *Cluster) CreateTopic(t testing.TB, name string, partitions int32) {
	t.Helper()
	c.CreateTopicConfig(t, name, partitions, nil)
}

// CreateTopicConfig is CreateTopic with topic configs (such as
// max.message.bytes).
func (c *Cluster) CreateTopicConfig(t testing.TB, name string, partitions int32, configs map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cfg map[string]*string
	for k, v := range configs {
		if cfg == nil {
			cfg = map[string]*string{}
		}
		cfg[k] = &v
	}
	resp, err := c.admin.CreateTopic(ctx, partitions, -1, cfg, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("kafkatest: create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = c.admin.DeleteTopics(ctx, name)
	})
	// Wait until every partition has a leader, so the first produce does
	// not race the topic's creation on a real cluster.
	for {
		md, err := c.admin.Metadata(ctx, name)
		if err == nil {
			if td, ok := md.Topics[name]; ok && td.Err == nil && len(td.Partitions) == int(partitions) {
				ready := true
				for _, p := range td.Partitions {
					ready = ready && p.Err == nil && p.Leader >= 0
				}
				if ready {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("kafkatest: topic %s has no leaders: %v", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Name returns a random name (for a topic or a consumer group) starting
// with prefix.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// Client returns a client on the cluster with opts, closed when the test
// ends.
func (c *Cluster) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Seeds...)}, opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// IdleMember is a member of a consumer group that never fetches: the
// records of its partitions wait for it (a member that stalled, or whose
// partitions a test wants moved later with Close).
type IdleMember struct {
	*kgo.Client
	mu    sync.Mutex
	owned map[int32]bool
}

// IdleMember joins group as a consumer of topic that never fetches, with
// opts (kgo.HeartbeatInterval, say). It is closed when the test ends.
func (c *Cluster) IdleMember(t testing.TB, group, topic string, opts ...kgo.Opt) *IdleMember {
	t.Helper()
	m := &IdleMember{owned: map[int32]bool{}}
	track := func(add bool) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, p := range ps[topic] {
				if add {
					m.owned[p] = true
				} else {
					delete(m.owned, p)
				}
			}
		}
	}
	m.Client = c.Client(t, append([]kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.OnPartitionsAssigned(track(true)),
		kgo.OnPartitionsRevoked(track(false)),
		kgo.OnPartitionsLost(track(false)),
	}, opts...)...)
	m.PauseFetchTopics(topic)
	return m
}

// Owned returns the partitions of the topic the member owns, in order.
func (m *IdleMember) Owned() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.owned))
}

// Produce writes rs synchronously with an idempotent producer and fails the
// test on any error. Records without a topic go to topic.
func (c *Cluster) Produce(t testing.TB, topic string, rs ...*kgo.Record) {
	t.Helper()
	cl := c.Client(t, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("kafkatest: produce to %s: %v", topic, err)
	}
	cl.Close()
}

// EndOffsets returns the end offset (the number of records ever written,
// for a topic nobody deleted records from) of each partition of topic. A
// partition error kgo retries (NOT_LEADER_FOR_PARTITION after a partition
// moved, until the client's metadata has the new leader) is asked again.
func (c *Cluster) EndOffsets(t testing.TB, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ends, err := c.admin.ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatalf("kafkatest: end offsets of %s: %v", topic, err)
		}
		out := map[int32]int64{}
		var perr error
		ends.Each(func(o kadm.ListedOffset) {
			if o.Err != nil {
				perr = fmt.Errorf("kafkatest: end offset of %s/%d: %w", topic, o.Partition, o.Err)
			}
			out[o.Partition] = o.Offset
		})
		switch {
		case perr == nil:
			return out
		case !kerr.IsRetriable(perr) || ctx.Err() != nil:
			t.Fatal(perr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Committed returns the offsets group committed for topic, by partition
// (partitions without a commit are absent).
func (c *Cluster) Committed(t testing.TB, group, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offs, err := c.admin.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return map[int32]int64{}
	}
	if err != nil {
		t.Fatalf("kafkatest: committed offsets of %s: %v", group, err)
	}
	out := map[int32]int64{}
	for p, o := range offs[topic] {
		if o.Err == nil && o.At >= 0 {
			out[p] = o.At
		}
	}
	return out
}

// Records reads every record of topic, from the start to the end offsets
// of the moment of the call, in partition then offset order.
func (c *Cluster) Records(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	ends := c.EndOffsets(t, topic)
	want := map[int32]int64{}
	parts := map[string]map[int32]kgo.Offset{topic: {}}
	for p, end := range ends {
		parts[topic][p] = kgo.NewOffset().AtStart()
		if end > 0 {
			want[p] = end
		}
	}
	cl := c.Client(t, kgo.ConsumePartitions(parts), kgo.FetchMaxWait(100*time.Millisecond))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	byPart := map[int32][]*kgo.Record{}
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("kafkatest: read %s: %v (still waiting for %v)", topic, err, want)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Fatalf("kafkatest: read %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			byPart[r.Partition] = append(byPart[r.Partition], r)
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	var out []*kgo.Record
	for p := int32(0); p < int32(len(ends)); p++ {
		out = append(out, byPart[p]...)
	}
	return out
}
