package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// commitLog records the offset commit requests that asked for a
// partition's offset below one asked for before.
type commitLog struct {
	mu   sync.Mutex
	high map[string]int64 // topic/partition -> highest offset committed
	back []string
}

func watchCommits(t *testing.T, kc *kafkatest.Cluster) *commitLog {
	l := &commitLog{high: map[string]int64{}}
	fake := kc.Fake(t)
	fake.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				k := fmt.Sprintf("%s/%d", rt.Topic, rp.Partition)
				if h, ok := l.high[k]; ok && rp.Offset < h {
					l.back = append(l.back, fmt.Sprintf("%s %d after %d (member %s, generation %d)", k, rp.Offset, h, req.MemberID, req.Generation))
				}
				l.high[k] = max(l.high[k], rp.Offset)
			}
		}
		return nil, nil, false
	})
	return l
}

// backwards returns the commit requests that asked for an offset below one
// asked for before (whether or not the broker took them).
func (l *commitLog) backwards() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.back)
}

// droppedCase is a shape of group the dropped-member test runs in.
type droppedCase struct {
	name   string
	topics int
	opts   func(member string) []kgo.Opt
	// paused: the first member's heartbeats go unanswered while it is
	// held, as those of a process stopped (SIGSTOP, a long GC pause):
	// its session expires, instead of the rebalance timeout dropping it.
	paused bool
	// committed: the first member is held after its first poll's offset
	// commit succeeded (in OnBatch), not before it (its commit then
	// fails, and waits as pending).
	committed bool
}

// A member whose poll is held (after its transactions committed, before
// or after its offset commit) while a second member joins is dropped by
// the group once the rebalance timeout passes; the second member takes
// every partition and consumes them, and more records, to their end. Then
// the first one's poll is let go: it joins again (under a new member ID
// on the classic protocol, without OnPartitionsLost) and gets partitions
// back. Nothing is skipped or applied twice, each key keeps its order,
// and the group's offsets end, and stay, at every partition's end: the
// dropped member commits nothing fetched under its old membership under
// its new one (which moved a partition's offset back for good).
// Deterministic: the first member is let go only once the other has
// consumed and committed everything, and kfake answers its heartbeats and
// its SyncGroup so that it goes down the path without a loss.
func TestDroppedMemberRejoins(t *testing.T) {
	t.Parallel()
	for _, tc := range []droppedCase{
		{name: "cooperative", topics: 1},
		{name: "cooperative-committed", topics: 1, committed: true},
		{name: "cooperative-two-topics", topics: 2},
		{name: "eager", topics: 1, opts: func(string) []kgo.Opt { return []kgo.Opt{kgo.Balancers(kgo.RangeBalancer())} }},
		{name: "static", topics: 1, opts: func(m string) []kgo.Opt { return []kgo.Opt{kgo.InstanceID(kafkatest.Name("inst-" + m))} }},
		{name: "static-committed", topics: 1, committed: true, opts: func(m string) []kgo.Opt { return []kgo.Opt{kgo.InstanceID(kafkatest.Name("inst-" + m))} }},
		{name: "session-expired", topics: 1, paused: true},
		{name: "kip848", topics: 1, opts: func(string) []kgo.Opt { return []kgo.Opt{kgo.ServerSideBalancer()} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testDroppedMemberRejoins(t, tc)
		})
	}
}

func testDroppedMemberRejoins(t *testing.T, tc droppedCase) {
	b := setupPostgres(t)
	kc := kafkatest.New(t)
	commits := watchCommits(t, kc)
	const perTopic, keys, parts = 200, 20, 4
	group := kafkatest.Name("g")
	var (
		topics []string
		evs    []event.Envelope
	)
	for range tc.topics {
		topic := kc.Topic(t, "orders", parts)
		e := newEvents(t, perTopic, keys)
		kc.Produce(t, topic, recordsOf(topic, e...)...)
		topics = append(topics, topic)
		evs = append(evs, e...)
	}
	extra := func(m string) []kgo.Opt {
		o := []kgo.Opt{kgo.RebalanceTimeout(time.Second)}
		if tc.paused && m == "a" {
			o = []kgo.Opt{kgo.RebalanceTimeout(30 * time.Second), kgo.SessionTimeout(kc.SessionTimeout())}
		}
		if tc.opts != nil {
			o = append(o, tc.opts(m)...)
		}
		return o
	}

	// The first member is held after its first poll's transactions
	// committed (before or after their offset commit, see committed): it
	// holds no database lock meanwhile, so the second member consumes
	// everything.
	var (
		polls     atomic.Int64
		held      = make(chan struct{})
		release   = make(chan struct{})
		paused    atomic.Bool
		clientA   atomic.Pointer[kgo.Client]
		oldMember atomic.Value // string: its member ID when held
	)
	fake := kc.Fake(t)
	// The first member's heartbeats under its old ID are answered
	// REBALANCE_IN_PROGRESS from when it is held on, as they are until
	// the group has dropped it: so it sees no UNKNOWN_MEMBER_ID (which
	// kgo ends in OnPartitionsLost) before it is let go, as a member
	// whose heartbeat interval is longer than the rest of its poll. A
	// paused member's go unanswered (its connection is closed) instead.
	fake.ControlKey(int16(kmsg.Heartbeat), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		req := kreq.(*kmsg.HeartbeatRequest)
		if old, _ := oldMember.Load().(string); old == "" || req.MemberID != old {
			return nil, nil, false
		}
		if tc.paused {
			if paused.Load() {
				return nil, errors.New("paused"), true
			}
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.RebalanceInProgress.Code
		return resp, nil, true
	})
	// The first member's SyncGroup after it joined again under a new ID
	// is answered 500 ms late (within its rebalance timeout): kgo names
	// the new ID from the JoinGroup answer on, while its fetch positions,
	// its buffered records and its partitions are still the old
	// membership's until the sync.
	var syncDelayed atomic.Bool
	fake.ControlKey(int16(kmsg.SyncGroup), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		cl := clientA.Load()
		old, _ := oldMember.Load().(string)
		if cl == nil || old == "" {
			return nil, nil, false
		}
		if m, _ := cl.GroupMetadata(); kreq.(*kmsg.SyncGroupRequest).MemberID == m && m != old && syncDelayed.CompareAndSwap(false, true) {
			fake.SleepControl(func() { time.Sleep(500 * time.Millisecond) })
		}
		return nil, nil, false
	})
	holdFirst := func() {
		switch polls.Add(1) {
		case 1:
			m, _ := clientA.Load().GroupMetadata()
			oldMember.Store(m)
			paused.Store(true)
			close(held)
			select {
			case <-release:
			case <-time.After(60 * time.Second):
			}
			// The records it fetched but did not poll yet come
			// back only after it joined again (as a fetch of its
			// kept positions answered after the join would).
			cl := clientA.Load()
			cl.PauseFetchTopics(topics...)
			go func() {
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if m, _ := cl.GroupMetadata(); m != "" && m != oldMember.Load() {
						break
					}
				}
				cl.ResumeFetchTopics(topics...)
			}()
		case 2:
			if tc.committed {
				return
			}
			// Its next commit, of the first poll's records (its
			// commit was refused: pending), waits until kgo has
			// joined again, so that it would go out under the new
			// member ID.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if m, _ := clientA.Load().GroupMetadata(); m != "" && m != oldMember.Load() {
					return
				}
			}
		}
	}
	hold := func(c *idemkafka.Consumer[pgx.Tx]) {
		if !tc.committed {
			idemkafka.SetBeforeCommit(c, func([]*kgo.Record) { holdFirst() })
		}
	}
	var (
		mu              sync.Mutex
		ownedB          = map[string]bool{}
		assignedAfterGo int
		releasedA       bool
		lostA           int
	)
	key := func(t string, p int32) string { return fmt.Sprintf("%s/%d", t, p) }
	logA := &lineCounter{}
	cfgA := consumerConfig(kc, b, "billing", group, nil, topics...)
	cfgA.Logger = slog.New(logA)
	cfgA.MaxPollRecords = 100
	if tc.committed {
		cfgA.OnBatch = func(context.Context, idemkafka.BatchStats) { holdFirst() }
	}
	cfgA.ExtraOpts = append(cfgA.ExtraOpts, extra("a")...)
	cfgA.ExtraOpts = append(cfgA.ExtraOpts,
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, ps map[string][]int32) {
			clientA.Store(cl)
			mu.Lock()
			defer mu.Unlock()
			if releasedA && len(ps) > 0 {
				assignedAfterGo++
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			mu.Lock()
			defer mu.Unlock()
			if len(ps) > 0 {
				lostA++
			}
		}),
	)
	a := start(t, b, "billing", cfgA, hold)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the first member never committed a poll")
	}
	// More records, which the held member does not fetch: kgo fetches
	// no more from a broker while the records of its last fetch wait to
	// be polled (the first poll took 100 of them). The other member
	// consumes them and commits the partitions further than the held
	// member's first poll went.
	for _, topic := range topics {
		more := make([]event.Envelope, perTopic)
		for j := range more {
			e, err := event.New("OrderCreated.v1", fmt.Sprintf("order-%d", j%keys), payload{N: perTopic + j})
			if err != nil {
				t.Fatal(err)
			}
			more[j] = e
		}
		kc.Produce(t, topic, recordsOf(topic, more...)...)
		evs = append(evs, more...)
	}

	track := func(v bool) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			mu.Lock()
			defer mu.Unlock()
			for topic, pp := range ps {
				for _, p := range pp {
					ownedB[key(topic, p)] = v
				}
			}
		}
	}
	cfgB := consumerConfig(kc, b, "billing", group, nil, topics...)
	cfgB.ExtraOpts = append(cfgB.ExtraOpts, extra("b")...)
	cfgB.ExtraOpts = append(cfgB.ExtraOpts, kgo.OnPartitionsAssigned(track(true)), kgo.OnPartitionsRevoked(track(false)), kgo.OnPartitionsLost(track(false)))
	bb := start(t, b, "billing", cfgB)
	waitFor(t, 60*time.Second, "the second member owns every partition (the first one dropped)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range ownedB {
			if v {
				n++
			}
		}
		return n == tc.topics*parts
	})
	settled := func() bool {
		if distinct(t, b, "billing") != len(evs) {
			return false
		}
		for _, topic := range topics {
			if !allCommitted(t, kc, group, topic) {
				return false
			}
		}
		return true
	}
	state := func() string {
		s := ""
		for _, topic := range topics {
			s += fmt.Sprintf(" %s: committed %v of ends %v;", topic, kc.Committed(t, group, topic), kc.EndOffsets(t, topic))
		}
		return fmt.Sprintf("%d of %d events applied;%s first member %+v, second %+v; commits moving an offset back: %v",
			distinct(t, b, "billing"), len(evs), s, a.stats.get(), bb.stats.get(), commits.backwards())
	}
	waitFor(t, 60*time.Second, "the second member applies and commits everything", settled)
	mu.Lock()
	releasedA = true
	mu.Unlock()
	paused.Store(false)
	close(release)

	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		again := assignedAfterGo > 0
		mu.Unlock()
		if again {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s the first member has no partitions again: %s; its log: %v", state(), logA.counts())
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for !settled() {
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: %s", state())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// And it stays there: a commit of the old membership's offsets would
	// come at the first member's next polls.
	for range 40 {
		time.Sleep(100 * time.Millisecond)
		if !settled() {
			t.Fatalf("the group's offsets moved back after they reached the end: %s", state())
		}
	}
	mustStop(t, a)
	mustStop(t, bb)
	// A resync is a rejoin under the same member ID: it must not find
	// the membership changed and resync again.
	for msg, n := range logA.counts() {
		if strings.Contains(msg, "consuming its topics anew") && n > 1 {
			t.Errorf("the first member logged %d times %q; want it once at most (a resync causing another)", n, msg)
		}
	}
	mustOnce(t, b, "billing", evs)
	if tc.topics == 1 { // the topics' events share their keys
		mustKeyOrder(t, b.rows(t, "billing"))
	}
	mu.Lock()
	t.Logf("%s; first member lost its partitions %d times (OnPartitionsLost); its log: %v", state(), lostA, logA.counts())
	mu.Unlock()
}

// lineCounter is a slog.Handler that counts the lines of each message at
// INFO and above.
type lineCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *lineCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *lineCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[r.Level.String()+" "+r.Message]++
	return nil
}

func (h *lineCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *lineCounter) WithGroup(string) slog.Handler      { return h }

func (h *lineCounter) counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.n)
}
