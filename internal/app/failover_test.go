package app_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/stallmeter"
)

// The partitions a replica takes over on a rebalance (another replica died
// or left) are consumed at once, even while the partitions it already had
// are idle. kgo adds them to the broker's fetch in flight only when that
// fetch returns, and a fetch of idle partitions waits for records up to
// its max wait: kgo's default of 5 s made a failover of two replicas take
// 11-13 s instead of 6-7 s (the session timeout and a heartbeat).
//
// The other member of the projection's group is a plain client that never
// fetches (its partitions' events wait for it), so this replica owns the
// rest; once its own partitions are consumed to their end, the other
// member leaves, and every order's events must be applied well before a
// 5 s fetch would return.
func TestKafkaMovedPartitionsConsumedAtOnce(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	topic := kafkatest.Name("idemd-moved")
	cluster.CreateTopic(t, topic, 3)
	cluster.CreateTopic(t, topic+".dlq", 1)

	member := cluster.IdleMember(t, app.ProjectionGroup, topic)
	owned := member.Owned
	waitFor(t, "the other member owns every partition", func() bool { return len(owned()) == 3 })

	dbArg, count := dbCounter(t, app.Postgres)
	s := serveOn(t, dbArg, count, "-kafka", strings.Join(cluster.Seeds, ","), "-kafka-topic", topic)
	// Cooperative rebalancing hands this replica some of the partitions.
	waitFor(t, "the replica takes some partitions", func() bool { n := len(owned()); return n > 0 && n < 3 })
	theirs := owned()
	ours := func(p int32) bool { return !slices.Contains(theirs, p) }

	// Orders (one customer each) until both members have events of them.
	n := 0
	for {
		n++
		if r := s.do(http.MethodPost, "/v1/orders", fmt.Sprintf("moved-%d", n), orderBody(n, "1.00")); r.status != http.StatusCreated {
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
		s.waitCount(fmt.Sprintf("customer_order WHERE status = 'CONFIRMED' AND customer_id = %d", n), 1)
		var mine, theirsToo bool
		for p, end := range cluster.EndOffsets(t, topic) {
			if end > 0 {
				mine, theirsToo = mine || ours(p), theirsToo || !ours(p)
			}
		}
		if mine && theirsToo {
			break
		}
		if n == 50 {
			t.Fatalf("%d orders and the partitions of one member still have no event", n)
		}
	}
	// Every event published (the saga, this replica's alone, confirmed
	// every order), and this replica's partitions consumed to their end:
	// its projection's next fetch waits for records.
	s.waitCount("outbox_pending", 0)
	waitFor(t, "the replica consumes its partitions to their end", func() bool {
		ends, committed := cluster.EndOffsets(t, topic), cluster.Committed(t, app.ProjectionGroup, topic)
		for p, end := range ends {
			if ours(p) && end > 0 && committed[p] != end {
				return false
			}
		}
		return true
	})
	if got := count("customer_order_summary WHERE confirmed = 1"); got == n {
		t.Fatalf("all %d orders are projected before the other member left: none was on its partitions %v", n, theirs)
	}

	left := time.Now()
	m := stallmeter.Start(t)
	member.Close() // leaves the group: its partitions move to the replica
	limit := app.ConsumerFetchMaxWait + 2500*time.Millisecond
	for count("customer_order_summary WHERE confirmed = 1") != n {
		if time.Since(left) > 15*time.Second {
			t.Fatalf("the events of the partitions %v, moved to the replica, are not applied 15 s after the other member left", theirs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The time the process ran: a loaded machine stalls it for seconds.
	took, stalled := m.Elapsed()
	t.Logf("the events of the partitions %v were applied %.2f s after the other member left (%.2f s of which the process stood still)",
		theirs, (took + stalled).Seconds(), stalled.Seconds())
	if took > limit {
		t.Errorf("the events of the partitions %v, moved to the replica, were applied %.2f s after the other member left, less %.2f s the process stood still, want under %v (a heartbeat, a fetch's max wait and the batch)",
			theirs, took.Seconds(), stalled.Seconds(), limit)
	}
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, what, 30*time.Second, cond)
}

// waitForWithin polls cond for up to d.
func waitForWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, d)
		}
	}
}
