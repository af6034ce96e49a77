package idemkafka

import (
	"errors"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// groupFailureLogInterval is how often a group failure that keeps repeating
// is logged again, as the relay does for its failures (outbox).
const groupFailureLogInterval = 30 * time.Second

// groupFailures limits the log lines of the fetch errors that are not about
// a partition: kgo's group loop reports each failed try (to join the group,
// or to keep its session: every 1-4 s while the brokers are unreachable or
// the coordinator fails) as a fetch error of topic "" (a
// *kgo.ErrGroupSession), with whatever error the try met. They are one
// failure, whatever their text (a dial refused, then a timeout, then
// COORDINATOR_NOT_AVAILABLE while the brokers come back): the first is
// logged at once, its repeats are counted and logged at most every
// groupFailureLogInterval (with the latest error), and the next assignment
// (the group is joined: kgo calls OnPartitionsAssigned after every join,
// even with nothing assigned) ends it with one line. Fetch errors of a
// topic or partition (offset out of range, authorization, data loss) are
// not grouped: each partition's are limited on their own (logPartitionFailure).
//
// Only failures and assignments use it: a poll without errors does not.
type groupFailures struct {
	mu sync.Mutex
	groupFailure
}

// groupFailure is the state of groupFailures.
type groupFailure struct {
	// first is the first failure (zero while none); logged the last
	// line; failures the failures since first, suppressed those not
	// logged since logged; err the latest.
	first, logged        time.Time
	failures, suppressed int
	err                  error
}

// isGroupFailure reports whether a fetch error is a failure of the group
// loop rather than of a topic or partition.
func isGroupFailure(topic string, err error) bool {
	var gs *kgo.ErrGroupSession
	return topic == "" && errors.As(err, &gs)
}

// failed records a failure at now and returns whether to log it and, if
// so, the state to log (failures == 1 for the first).
func (g *groupFailures) failed(err error, now time.Time) (bool, groupFailure) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.err = err
	if g.first.IsZero() {
		g.first, g.logged, g.failures, g.suppressed = now, now, 1, 0
		return true, g.snapshot()
	}
	g.failures++
	if now.Sub(g.logged) < groupFailureLogInterval {
		g.suppressed++
		return false, groupFailure{}
	}
	out := g.snapshot()
	g.logged, g.suppressed = now, 0
	return true, out
}

// joined ends the failure, if any, and returns it.
func (g *groupFailures) joined() (groupFailure, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.first.IsZero() {
		return groupFailure{}, false
	}
	out := g.snapshot()
	g.groupFailure = groupFailure{}
	return out, true
}

// snapshot copies the state, without the lock.
func (g *groupFailures) snapshot() groupFailure { return g.groupFailure }

// logGroupFailure logs a fetch error of the group loop through c.groupFail.
func (c *Consumer[TTx]) logGroupFailure(topic string, partition int32, err error) {
	log, g := c.groupFail.failed(err, time.Now())
	switch {
	case !log:
	case g.failures == 1:
		c.cfg.Logger.Error("idemkafka: fetch failed", "topic", topic, "partition", partition, "group", c.cfg.Group, "err", err)
	default:
		c.cfg.Logger.Error("idemkafka: fetch still failing; repeats are logged at most every "+groupFailureLogInterval.String(),
			"group", c.cfg.Group, "err", err, "suppressed", g.suppressed, "failures", g.failures, "since", g.first)
	}
}

// partFailure is a partition's fetch failure that goes on: kgo answers
// every fetch of a partition it will not move (OFFSET_OUT_OF_RANGE under
// kgo.NoResetOffset, TOPIC_AUTHORIZATION_FAILED) with the same error, at
// every poll.
type partFailure struct {
	first, logged, last  time.Time
	failures, suppressed int
}

// logPartitionFailure logs a fetch error of a topic or partition: the
// first at once, its repeats (whatever their error) at most every
// groupFailureLogInterval, with the latest error and how many were not
// logged. A failure groupFailureLogInterval after the partition's last
// one starts anew. Called by Run's goroutine only, on fetch errors only.
func (c *Consumer[TTx]) logPartitionFailure(topic string, partition int32, err error, now time.Time) {
	tp := topicPartition{topic, partition}
	f := c.partFail[tp]
	if f == nil || now.Sub(f.last) >= groupFailureLogInterval {
		if c.partFail == nil {
			c.partFail = map[topicPartition]*partFailure{}
		}
		c.partFail[tp] = &partFailure{first: now, logged: now, last: now, failures: 1}
		c.cfg.Logger.Error("idemkafka: fetch failed", "topic", topic, "partition", partition, "err", err)
		return
	}
	f.failures++
	f.last = now
	if now.Sub(f.logged) < groupFailureLogInterval {
		f.suppressed++
		return
	}
	c.cfg.Logger.Error("idemkafka: fetch of the partition still failing; repeats are logged at most every "+groupFailureLogInterval.String(),
		"topic", topic, "partition", partition, "err", err, "suppressed", f.suppressed, "failures", f.failures, "since", f.first)
	f.logged, f.suppressed = now, 0
}

// logGroupJoined logs the end of the group failures, if any: the group
// was joined.
func (c *Consumer[TTx]) logGroupJoined() {
	g, ok := c.groupFail.joined()
	if !ok {
		return
	}
	c.cfg.Logger.Info("idemkafka: group joined again after failures; fetching",
		"group", c.cfg.Group, "failures", g.failures, "over", time.Since(g.first).Round(time.Millisecond).String(), "since", g.first, "err", g.err)
}

// rebalanceRefusal reports whether err, an offset commit's, is the group's
// refusal while it rebalances or after it did (the member's generation or
// ID is no longer current): routine in Kafka, and over once the member has
// joined again, which kgo does by itself. kgo retries the coordinator's
// errors (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
// COORDINATOR_NOT_AVAILABLE) for its retry timeout before returning them:
// one that comes back is an outage, not a move.
func rebalanceRefusal(err error) bool {
	return errors.Is(err, kerr.RebalanceInProgress) || errors.Is(err, kerr.IllegalGeneration) ||
		errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.StaleMemberEpoch) ||
		errors.Is(err, kerr.FencedMemberEpoch) || errors.Is(err, errMemberChanged)
}

// logCommit logs the outcome of an offset commit of a poll, err nil for
// one that succeeded. A commit refused by a rebalance (rebalanceRefusal)
// is logged at INFO. Any other failure is a WARN when first seen; as the
// pending commit is retried every pendingRetry (and at each poll), its
// repeats are counted and logged at most every groupFailureLogInterval,
// whatever their error, and the next commit that succeeds ends them with
// an INFO line.
func (c *Consumer[TTx]) logCommit(err error) {
	if err == nil {
		g, ok := c.commitFail.joined()
		if ok {
			c.cfg.Logger.Info("idemkafka: offset commits succeed again",
				"group", c.cfg.Group, "failures", g.failures, "over", time.Since(g.first).Round(time.Millisecond).String(), "since", g.first, "err", g.err)
		}
		return
	}
	if rebalanceRefusal(err) {
		c.cfg.Logger.Info("idemkafka: offset commit refused by a rebalance; it is retried, and records redelivered meanwhile are skipped as duplicates",
			"group", c.cfg.Group, "err", err)
		return
	}
	log, g := c.commitFail.failed(err, time.Now())
	switch {
	case !log:
	case g.failures == 1:
		c.cfg.Logger.Warn("idemkafka: offset commit failed; it is retried, and records redelivered meanwhile are skipped as duplicates",
			"group", c.cfg.Group, "err", err)
	default:
		c.cfg.Logger.Warn("idemkafka: offset commits still failing; repeats are logged at most every "+groupFailureLogInterval.String(),
			"group", c.cfg.Group, "err", err, "suppressed", g.suppressed, "failures", g.failures, "since", g.first)
	}
}
