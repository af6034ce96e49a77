package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// kafkaLagInterval is how often idemd measures its consumer groups' lag
// (idemd_kafka_consumer_lag): three small admin requests per group, never
// on a scrape.
const kafkaLagInterval = 10 * time.Second

// lagLogInterval bounds how often a lag measurement that keeps failing is
// logged again.
const lagLogInterval = 30 * time.Second

// lagChecker measures the lag of consumer groups on one topic: for each
// partition, its end offset minus the group's committed offset (the log
// start offset where the group committed none or the records are gone,
// where its consumers start), summed. A failed measurement keeps the last
// value of the gauge, counts in idemd_kafka_consumer_lag_failures_total
// and is logged when it starts, at most every lagLogInterval while it
// lasts, and once when a measurement succeeds again.
type lagChecker struct {
	adm    *kadm.Client
	topic  string
	groups []string
	m      *metrics
	log    *slog.Logger

	// fails logs the failed rounds (set up by the first one).
	fails failureLog
}

// run measures now, then every kafkaLagInterval until ctx ends.
func (c *lagChecker) run(ctx context.Context) error {
	t := time.NewTicker(kafkaLagInterval)
	defer t.Stop()
	for {
		c.check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// check measures every group's lag once.
func (c *lagChecker) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, kafkaLagInterval)
	defer cancel()
	starts, err := c.adm.ListStartOffsets(ctx, c.topic)
	if err == nil {
		err = starts.Error()
	}
	var ends kadm.ListedOffsets
	if err == nil {
		ends, err = c.adm.ListEndOffsets(ctx, c.topic)
	}
	if err == nil {
		err = ends.Error()
	}
	if err == nil && len(ends[c.topic]) == 0 {
		err = fmt.Errorf("topic %s has no partitions", c.topic)
	}
	var failed error
	for _, g := range c.groups {
		lag, gerr := c.groupLag(ctx, g, starts, ends, err)
		if gerr != nil {
			if errors.Is(context.Cause(ctx), context.Canceled) {
				return // the shutdown: no failure to count
			}
			c.m.lagFailures.WithLabelValues(g).Inc()
			failed = fmt.Errorf("group %s: %w", g, gerr)
			continue
		}
		c.m.groupLag.WithLabelValues(g).Set(float64(lag))
	}
	c.logged(failed)
}

// groupLag returns the lag of group, or topicErr if the topic's offsets
// could not be listed.
func (c *lagChecker) groupLag(ctx context.Context, group string, starts, ends kadm.ListedOffsets, topicErr error) (int64, error) {
	if topicErr != nil {
		return 0, topicErr
	}
	commits, err := c.adm.FetchOffsets(ctx, group)
	if err == nil {
		err = commits.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// A group that never committed (some brokers say so): its
		// consumers start at the log start.
		commits, err = nil, nil
	}
	if err != nil {
		return 0, err
	}
	var lag int64
	for p, end := range ends[c.topic] {
		from := starts[c.topic][p].Offset
		if o, ok := commits.Lookup(c.topic, p); ok && o.At > from {
			from = o.At
		}
		lag += max(end.Offset-from, 0)
	}
	return lag, nil
}

// logged logs a failed round (err) or the end of the failures.
func (c *lagChecker) logged(err error) {
	if c.fails.log == nil {
		c.fails = failureLog{
			log:          c.log,
			recovered:    "kafka: consumer lag known again after failed measurements",
			failed:       "kafka: consumer lag unknown; idemd_kafka_consumer_lag keeps its last value",
			stillFailing: "kafka: consumer lag still unknown",
			countKey:     "failed_checks",
			attrs:        []any{"topic", c.topic},
		}
	}
	c.fails.observe(err)
}
