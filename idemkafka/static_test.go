package idemkafka_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// staticSession is the session timeout of the static-membership tests: far
// longer than they may take, so a test that passes did not wait for a
// session to expire.
const staticSession = 30 * time.Second

// ownership records which partitions of topic each named consumer was
// assigned, and how many assignments each saw.
type ownership struct {
	topic string

	mu       sync.Mutex
	owned    map[string]map[int32]bool
	assigned map[string]int
}

func newOwnership(topic string) *ownership {
	return &ownership{topic: topic, owned: map[string]map[int32]bool{}, assigned: map[string]int{}}
}

// opts are the callbacks that track the consumer name.
func (o *ownership) opts(name string) []kgo.Opt {
	set := func(v bool) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			o.mu.Lock()
			defer o.mu.Unlock()
			if o.owned[name] == nil {
				o.owned[name] = map[int32]bool{}
			}
			if v && len(ps[o.topic]) > 0 {
				o.assigned[name]++
			}
			for _, p := range ps[o.topic] {
				o.owned[name][p] = v
			}
		}
	}
	return []kgo.Opt{kgo.OnPartitionsAssigned(set(true)), kgo.OnPartitionsRevoked(set(false)), kgo.OnPartitionsLost(set(false))}
}

func (o *ownership) owns(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, v := range o.owned[name] {
		if v {
			n++
		}
	}
	return n
}

func (o *ownership) assignments(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.assigned[name]
}

// A static member (InstanceID) that stops keeps its partitions: the other
// member does not take them over, and the member restarted under the same
// ID gets them back at once, long before its session would have expired.
// Nothing is lost or applied twice.
func TestStaticMemberRestartGetsItsPartitionsBack(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	group := kafkatest.Name("g")
	own := newOwnership(topic)

	config := func(name, id string) idemkafka.ConsumerConfig[pgx.Tx] {
		cfg := consumerConfig(kc, b, "billing", group, nil, topic)
		cfg.InstanceID = id
		cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.SessionTimeout(staticSession), kgo.HeartbeatInterval(time.Second))
		cfg.ExtraOpts = append(cfg.ExtraOpts, own.opts(name)...)
		return cfg
	}
	a := start(t, b, "billing", config("a", "billing-0"))
	waitFor(t, 30*time.Second, "a to own both partitions", func() bool { return own.owns("a") == 2 })
	other := start(t, b, "billing", config("b", "billing-1"))
	waitFor(t, 30*time.Second, "a and b to own a partition each", func() bool { return own.owns("a") == 1 && own.owns("b") == 1 })
	first := newEvents(t, 20, 8)
	kc.Produce(t, topic, recordsOf(topic, first...)...)
	waitFor(t, 30*time.Second, "the first events committed", func() bool { return allCommitted(t, kc, group, topic) })

	// a stops (a deploy, a crash): as a static member it does not leave,
	// so its partition waits for it instead of moving to b.
	mustStop(t, a)
	assignedB := own.assignments("b")
	second := newEvents(t, 40, 8)
	kc.Produce(t, topic, recordsOf(topic, second...)...)
	time.Sleep(2 * time.Second)
	if n := own.owns("b"); n != 1 || own.assignments("b") != assignedB {
		t.Fatalf("while the static member a was stopped, b owned %d partitions (%d assignments, %d before); want its one partition, not a's",
			n, own.assignments("b"), assignedB)
	}

	// Within a third of the session: a's old session is still live, so
	// only the static rejoin can give a2 the partition this soon.
	start(t, b, "billing", config("a2", "billing-0"))
	waitFor(t, staticSession/3, "the restarted member to apply its partition's events", func() bool { return allCommitted(t, kc, group, topic) })
	if own.owns("a2") != 1 || own.owns("b") != 1 || own.assignments("b") != assignedB {
		t.Fatalf("after the restart: a2 owns %d, b owns %d partitions, b was assigned %d times (%d before); want 1 each, b never given a's",
			own.owns("a2"), own.owns("b"), own.assignments("b"), assignedB)
	}
	mustStop(t, other)
	mustOnce(t, b, "billing", append(first, second...))
}

// Two consumers given one InstanceID: the broker gives the partitions to
// the one that joined last and fences the other, whose Run returns
// ErrFenced instead of joining again (and fencing the newcomer in turn).
func TestStaticMemberFencedStops(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	group := kafkatest.Name("g")
	own := newOwnership(topic)

	config := func(name string) idemkafka.ConsumerConfig[pgx.Tx] {
		cfg := consumerConfig(kc, b, "billing", group, nil, topic)
		cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.InstanceID("billing-0"), // through ExtraOpts: detected all the same
			kgo.SessionTimeout(staticSession), kgo.HeartbeatInterval(200*time.Millisecond))
		cfg.ExtraOpts = append(cfg.ExtraOpts, own.opts(name)...)
		return cfg
	}
	first := start(t, b, "billing", config("first"))
	waitFor(t, 30*time.Second, "the first consumer to own both partitions", func() bool { return own.owns("first") == 2 })
	evs := newEvents(t, 20, 8)
	kc.Produce(t, topic, recordsOf(topic, evs[:10]...)...)
	waitFor(t, 30*time.Second, "the first events committed", func() bool { return allCommitted(t, kc, group, topic) })

	second := start(t, b, "billing", config("second"))
	mustBeFenced(t, first, staticSession/2)

	// The newcomer keeps the partitions: the fenced one did not come back.
	kc.Produce(t, topic, recordsOf(topic, evs[10:]...)...)
	waitFor(t, 30*time.Second, "the second consumer to apply the rest", func() bool {
		return own.owns("second") == 2 && allCommitted(t, kc, group, topic)
	})
	time.Sleep(time.Second)
	if own.owns("second") != 2 || own.assignments("second") != 1 {
		t.Fatalf("the second consumer owns %d partitions after %d assignments; want 2 after 1", own.owns("second"), own.assignments("second"))
	}
	mustStop(t, second)
	mustOnce(t, b, "billing", evs)
}

// A consumer that is backing off between failed polls (a fetch error on
// every poll) when another joins with its instance ID returns ErrFenced at
// once, not after its backoff: kgo joins again after its own short retry
// backoff, and would fence the newcomer in turn, both stopping.
func TestStaticMemberFencedWhileBackingOff(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	denied := kc.Topic(t, "denied", 1)
	kc.Fake(t).Fault(kfakeFault(kmsg.Fetch, denied, kerr.TopicAuthorizationFailed, -1))
	group := kafkatest.Name("g")
	own := newOwnership(topic)

	config := func(name string, pause time.Duration) idemkafka.ConsumerConfig[pgx.Tx] {
		cfg := consumerConfig(kc, b, "billing", group, nil, topic, denied)
		cfg.InstanceID = "billing-0"
		cfg.Retry.Backoff = func(int) time.Duration { return pause }
		cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.SessionTimeout(staticSession), kgo.HeartbeatInterval(200*time.Millisecond))
		cfg.ExtraOpts = append(cfg.ExtraOpts, own.opts(name)...)
		return cfg
	}
	first := start(t, b, "billing", config("first", time.Minute))
	waitFor(t, 30*time.Second, "the first consumer to own the partitions", func() bool { return own.owns("first") == 2 })
	time.Sleep(time.Second) // its polls fail: it backs off for 30 s to a minute

	second := start(t, b, "billing", config("second", 10*time.Millisecond))
	mustBeFenced(t, first, staticSession/3) // not its backoff of 30 s or more
	time.Sleep(2 * time.Second)             // what kgo's rejoin would have taken
	select {
	case err := <-second.done:
		t.Fatalf("the newcomer stopped (%v): the fenced consumer joined again and fenced it", err)
	default:
	}
	evs := newEvents(t, 10, 4)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	waitFor(t, 30*time.Second, "the newcomer to apply the events", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, second)
	mustOnce(t, b, "billing", evs)
}

// A session timeout the brokers refuse (outside their
// group.min/max.session.timeout.ms) can never join: Run says so and returns,
// instead of logging a failed join at every poll for ever.
func TestSessionTimeoutRefused(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	cfg := consumerConfig(kc, b, "billing", kafkatest.Name("g"), nil, topic)
	cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.SessionTimeout(time.Hour)) // Kafka's maximum is 30 minutes
	inst := start(t, b, "billing", cfg)
	select {
	case err := <-inst.done:
		inst.done <- err
		if !errors.Is(err, kerr.InvalidSessionTimeout) || !strings.Contains(err.Error(), "1h0m0s") {
			t.Fatalf("Run = %v; want an error naming the refused session timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer still runs with a session timeout the brokers refuse")
	}
}

// mustBeFenced waits up to within for in's Run to return ErrFenced.
func mustBeFenced(t *testing.T, in *instance, within time.Duration) {
	t.Helper()
	select {
	case err := <-in.done:
		in.done <- err // for the cleanup's stop
		if !errors.Is(err, idemkafka.ErrFenced) {
			t.Fatalf("the fenced consumer's Run = %v; want ErrFenced", err)
		}
	case <-time.After(within):
		t.Fatalf("the consumer still runs %v after another joined with its instance ID", within)
	}
}
