package idemkafka

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// SetBeforeCommit installs a hook that runs after a poll's batches
// committed in the database and before their offsets are committed.
func SetBeforeCommit[TTx any](c *Consumer[TTx], fn func(records []*kgo.Record)) {
	c.hooks.beforeCommit = fn
}

// StopCommitGrace is stopCommitGrace.
const StopCommitGrace = stopCommitGrace

// SetStallAfter sets how long a partition goes without progress before the
// consumer reports it stalled (a minute by default).
func SetStallAfter[TTx any](c *Consumer[TTx], d time.Duration) { c.stallAfter = d }

// SetDBLogTimes sets the summary interval and the quiet period of the
// database failures' lines (flaplog.Interval and flaplog.Quiet by default).
func SetDBLogTimes[TTx any](c *Consumer[TTx], interval, quiet time.Duration) {
	c.dbLog.Interval, c.dbLog.Quiet = interval, quiet
}
