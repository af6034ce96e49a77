package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/flaplog"
	"github.com/idemkit/idem/internal/txbegin"
)

// ErrRunning is returned by Run when the consumer is already running.
var ErrRunning = errors.New("idemkafka: consumer is already running")

// ErrFenced is returned (wrapped) by Run when another consumer joined the
// group with this consumer's InstanceID: two instances were given one ID.
// The consumer has stopped; running it again would fence the other one.
var ErrFenced = errors.New("idemkafka: fenced: another consumer joined the group with this instance ID")

// commitTimeout bounds one offset commit. A commit that fails is harmless:
// the records are redelivered and the inbox drops them. It is retried at
// the next poll, and at least every pendingRetry while the partition gets
// no new records, so a consumer lag left by a failed commit clears.
const commitTimeout = 30 * time.Second

// stopCommitGrace bounds an offset commit once Run's context has ended:
// the commit of the stop's last cycle, or one in flight when the stop
// came. A coordinator that does not answer (kgo retries it for its retry
// timeout, 30 s by default) must not hold the stop longer than a service's
// shutdown allows; the commit is harmless to lose.
const stopCommitGrace = 5 * time.Second

// DefaultFetchMaxWait is how long a consumer's fetch of idle partitions
// waits for records (kgo.FetchMaxWait, which ConsumerConfig.ExtraOpts may
// set; kgo's default is 5 s, the Java client's 500 ms). kgo adds the partitions a cooperative rebalance hands over (a member
// died or left) to the broker's fetch only once the fetch in flight
// returns: with 5 s, a consumer whose own partitions were idle started on
// a dead member's up to 5 s late. A fetch returns as soon as records
// arrive, so this costs only idle consumers: a fetch per broker every
// 500 ms.
const DefaultFetchMaxWait = 500 * time.Millisecond

// DefaultMetadataMaxAge is how often the clients of consumers and
// publishers read the cluster's metadata afresh (kgo.MetadataMaxAge, which
// ConsumerConfig.ExtraOpts and PublisherConfig.ExtraOpts may set; kgo's
// default, as the Java client's, is 5 minutes). Partitions an operator
// adds to a topic are seen only then: a consumer group's leader rebalances
// to hand them out at its next refresh, so with 5 minutes the records a
// producer that knew of them already wrote there (a relay started since,
// another replica) waited up to 5 minutes unconsumed; and the relays of
// several replicas, each refreshing at its own time, sent a key's events
// to its old or its new partition in turn for that long. The cost is one
// small metadata request per client every 10 s. A kgo.MetadataMinAge
// longer than that in ExtraOpts is the max age too.
const DefaultMetadataMaxAge = 10 * time.Second

// metadataMaxAge is the kgo.MetadataMaxAge of a client with the options
// of view: DefaultMetadataMaxAge, or their kgo.MetadataMinAge if longer
// (kgo refuses a max age below the min age).
func metadataMaxAge(view *kgo.Client) kgo.Opt {
	minAge, _ := view.OptValue(kgo.MetadataMinAge).(time.Duration)
	return kgo.MetadataMaxAge(max(DefaultMetadataMaxAge, minAge))
}

// pendingRetry is how long a poll waits for records while an offset commit
// that failed is waiting to be retried.
const pendingRetry = time.Second

type partitionsCallback = func(context.Context, *kgo.Client, map[string][]int32)

// Consumer applies the events of Kafka topics through an inbox, once per
// event ID, and commits each record's offset only after the database
// transaction that applied it committed. Create it with NewConsumer and call
// Run. See the package documentation for the guarantees.
type Consumer[TTx any] struct {
	in   *inbox.Inbox[TTx]
	cfg  ConsumerConfig[TTx]
	opts []kgo.Opt

	userAssigned, userRevoked, userLost partitionsCallback
	userBlocked                         func(context.Context, *kgo.Client)

	running atomic.Bool
	hooks   hooks

	// instanceID is the static member ID (InstanceID, or kgo.InstanceID
	// in ExtraOpts), empty for a dynamic member.
	instanceID string

	// resetAtEnd: ExtraOpts set kgo.ConsumeResetOffset at the log's end
	// (see Run's warning).
	resetAtEnd bool

	// pending holds, per owned partition, the last applied record whose
	// offset commit failed, until a commit of it or a later record of the
	// partition succeeds, or the partition is revoked or lost, or the
	// group membership it was polled under ends.
	pendingMu sync.Mutex
	pending   map[topicPartition]pendingCommit
	// rejoined: a commit found that the group had dropped this member
	// and it joined again under a new member ID (see pendingCommit).
	rejoined atomic.Bool
	// fetchMember is the group member ID the client's fetch positions
	// and buffered records belong to (see fetchMembership); empty until
	// the next assignment after Run starts, a loss of the partitions or
	// a resync.
	fetchMember atomic.Pointer[string]

	// groupFail limits the lines of the group loop's failures (see
	// groupFailures).
	groupFail groupFailures
	// commitFail limits the lines of failed offset commits (see
	// logCommit).
	commitFail groupFailures

	// stalls holds the owned partitions that made no progress since a
	// poll's tries of them all failed (see trackStall); nStalls is its
	// length, read without the lock on the hot path.
	stallMu    sync.Mutex
	stalls     map[topicPartition]*stall
	nStalls    atomic.Int32
	stallAfter time.Duration

	// dbLog limits the lines of the batches that fail on the database
	// (or the dead-letter topic), across the partitions.
	dbLog flaplog.Limiter

	// resets counts the OFFSET_OUT_OF_RANGE resets (see OffsetResets).
	resets atomic.Int64
	// partFail limits the lines of each partition's fetch failures (see
	// logPartitionFailure); Run's goroutine only.
	partFail map[topicPartition]*partFailure
}

// stallAfter is how long a partition goes without progress (its first
// record failing on a database or dead-letter topic fault, retried for
// ever) before the consumer logs it at ERROR, and then how often it logs it
// again while the stall lasts.
const stallAfter = time.Minute

// stall is a partition that has not moved on.
type stall struct {
	since  time.Time // the start of the first poll of it that applied nothing
	logged time.Time // the last ERROR line; zero before the first
	tries  int       // failed tries since
}

type topicPartition struct {
	topic     string
	partition int32
}

// hooks are test seams.
type hooks struct {
	// beforeCommit runs after a poll's batches committed in the database
	// and before their offsets are committed, with the records whose
	// offsets are about to be committed.
	beforeCommit func(records []*kgo.Record)
}

// NewConsumer returns a consumer that applies events with cfg.Handler (or
// cfg.BatchHandler) through in, whose driver runs the transactions (the
// handler receives them as TTx). cfg is required (Seeds, Topics and a
// handler); its Group defaults to in's consumer name. NewConsumer validates
// cfg and the kgo options (see ConsumerConfig.ExtraOpts) but does not
// connect: Run does.
func NewConsumer[TTx any](in *inbox.Inbox[TTx], cfg *ConsumerConfig[TTx]) (*Consumer[TTx], error) {
	if in == nil {
		return nil, errors.New("idemkafka: nil inbox")
	}
	if cfg == nil {
		return nil, errors.New("idemkafka: nil ConsumerConfig: Seeds, Topics and a Handler (or BatchHandler) are required")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfgv := *cfg
	if cfgv.Group == "" {
		cfgv.Group = in.Consumer()
	}
	c := &Consumer[TTx]{in: in, cfg: cfgv.withDefaults(), stallAfter: stallAfter}

	// Check the options on a client that never runs (see optionsView):
	// NewConsumer does no I/O, also when ExtraOpts name topics (a client
	// made from them joined the group at once). DisableAutoCommit, as Run
	// sets it, so that autocommit options that conflict with it are
	// refused here.
	probeOpts := append(slices.Clone(cfgv.ExtraOpts), kgo.SeedBrokers(cfgv.Seeds...), kgo.ConsumerGroup(cfgv.Group), kgo.DisableAutoCommit())
	probe, err := optionsView(probeOpts)
	if err != nil {
		if names := refusedOptions(probeOpts); len(names) > 0 {
			// A share group (KIP-932) has no offsets per partition: the
			// inbox commits them after each transaction.
			return nil, fmt.Errorf("%w: %s (the consumer consumes its Topics in group %q and commits their offsets)", ErrUnsupportedOption, strings.Join(names, " and "), cfgv.Group)
		}
		if err := refusedProducerOption(probeOpts); err != nil {
			return nil, fmt.Errorf("idemkafka: ExtraOpts (the consumer produces dead letters): %w", err)
		}
		return nil, optionsError("invalid ExtraOpts", err)
	}
	if err := checkProducer(probe); err != nil {
		return nil, fmt.Errorf("idemkafka: ExtraOpts (the consumer produces dead letters): %w", err)
	}
	if on, _ := probe.OptValue(kgo.ConsumeRegex).(bool); on {
		return nil, fmt.Errorf("%w: ConsumeRegex", ErrUnsupportedOption)
	}
	if on, _ := probe.OptValue(kgo.KeepControlRecords).(bool); on {
		// Every transaction marker would be polled as a record, found not
		// to be an idem event, and dead-lettered.
		return nil, fmt.Errorf("%w: KeepControlRecords (transaction markers would be dead-lettered as records)", ErrUnsupportedOption)
	}
	c.instanceID = cfgv.InstanceID
	if vs := probe.OptValues(kgo.InstanceID); len(vs) == 2 {
		if id, _ := vs[0].(string); vs[1] == true {
			switch {
			case c.instanceID != "" && id != c.instanceID:
				return nil, fmt.Errorf("idemkafka: invalid ConsumerConfig: InstanceID %q and kgo.InstanceID(%q) in ExtraOpts differ", c.instanceID, id)
			case c.instanceID == "":
				if err := checkName(id); err != nil {
					return nil, fmt.Errorf("idemkafka: invalid ExtraOpts: kgo.InstanceID %w", err)
				}
				c.instanceID = id
			}
		}
	}
	if on, _ := probe.OptValue(kgo.ServerSideBalancer).(bool); on && c.instanceID != "" {
		// KIP-848 refuses a second member with the ID (the newcomer, which
		// would retry for ever) instead of fencing the first, and holds a
		// crashed member's ID until its session ends: the guarantees of
		// InstanceID are the classic protocol's.
		return nil, fmt.Errorf("%w: an InstanceID with ServerSideBalancer (KIP-848 static membership is not supported)", ErrUnsupportedOption)
	}
	c.userAssigned, _ = probe.OptValue(kgo.OnPartitionsAssigned).(partitionsCallback)
	c.userRevoked, _ = probe.OptValue(kgo.OnPartitionsRevoked).(partitionsCallback)
	c.userLost, _ = probe.OptValue(kgo.OnPartitionsLost).(partitionsCallback)
	c.userBlocked, _ = probe.OptValue(kgo.OnPartitionsCallbackBlocked).(func(context.Context, *kgo.Client))
	if o, ok := probe.OptValue(kgo.ConsumeResetOffset).(kgo.Offset); ok && o.EpochOffset().Offset == -1 {
		c.resetAtEnd = true // NewOffset(), AtEnd(), with or without Relative
	}

	// Records of transactions their producer aborted never happened: read
	// committed ones only (kgo's default reads them all). Partitions
	// handed over by a rebalance are fetched within DefaultFetchMaxWait,
	// and partitions added to a topic are consumed within
	// DefaultMetadataMaxAge. ExtraOpts may say otherwise.
	c.opts = append([]kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(DefaultFetchMaxWait),
		metadataMaxAge(probe)}, cfgv.ExtraOpts...)
	if c.instanceID != "" {
		c.opts = append(c.opts, kgo.InstanceID(c.instanceID))
	}
	userLog, _ := probe.OptValue(kgo.WithLogger).(kgo.Logger)
	c.opts = append(c.opts,
		kgo.WithLogger(resetLogger{inner: userLog, log: c.cfg.Logger, group: cfgv.Group, resets: &c.resets}),
		kgo.SeedBrokers(cfgv.Seeds...),
		kgo.ConsumerGroup(cfgv.Group),
		kgo.ConsumeTopics(cfgv.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.OnPartitionsCallbackBlocked(c.onBlocked),
	)
	return c, nil
}

// Run joins the group and applies events until ctx is done, then finishes
// the database transaction in flight (within ConsumerConfig.TxTimeout), commits the offsets of what
// committed (waiting at most 5 s for the group coordinator from then on:
// offsets not committed are redelivered and skipped), leaves the group (a static member, with an InstanceID, does not
// leave: its partitions wait for it to come back) and returns nil. A
// transaction still waiting to begin (for a connection of an exhausted
// pool, or a server that does not answer) is abandoned at once. Records
// polled but not applied by then are left to the partition's next owner.
// Run returns an error only if the client cannot be created or is closed
// under it, one wrapping ErrFenced if another consumer joined with its
// InstanceID, one wrapping kerr.InvalidSessionTimeout if the brokers refuse
// its session timeout, and ErrRunning if the consumer is already running. A Consumer
// may be run again after Run returned.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)
	// Commits left pending by an earlier Run belong to a membership that
	// is gone: the group's next owner of those partitions commits them.
	c.pendingMu.Lock()
	clear(c.pending)
	c.pendingMu.Unlock()
	c.fetchMember.Store(nil)
	c.rejoined.Store(false)
	c.groupFail.joined() // a failure of an earlier Run ended with it
	c.clearStalls(nil)
	c.commitFail.joined()

	// fencedCh wakes a backoff between failed polls when another member
	// takes this one's instance ID: kgo joins again after its own retry
	// backoff, which would fence the other member in turn, unless Run has
	// returned (and closed the client) by then.
	fencedCh := make(chan struct{}, 1)
	cl, err := kgo.NewClient(append(slices.Clone(c.opts), kgo.WithHooks(fenceHook(fencedCh)))...)
	if err != nil {
		return fmt.Errorf("idemkafka: consumer client: %w", err)
	}
	// Leaves the group; there is nothing to commit (every cycle committed
	// what it applied).
	defer cl.CloseAllowingRebalance()
	if err := checkProducer(cl); err != nil { // cannot happen: checked in NewConsumer
		return err
	}
	c.cfg.Logger.Info("idemkafka: consumer started", "group", c.cfg.Group, "topics", c.cfg.Topics, "consumer", c.in.Consumer())
	if c.resetAtEnd {
		// Java's auto.offset.reset=latest, and as silent: kgo applies it
		// to every partition without an offset, not only at the group's
		// first start.
		c.cfg.Logger.Warn("idemkafka: kgo.ConsumeResetOffset is at the log's end: a partition without a committed offset (added to a topic, a group whose offsets were deleted or expired) or past its retention is consumed from its end, and the records written there before are never applied; "+
			"kgo's default, the log start, skips nothing (the inbox drops what was applied); to start a new group at the end of its topics, use kgo.NewOffset().AfterMilli(a time)",
			"group", c.cfg.Group, "topics", c.cfg.Topics)
	}
	// One look at the topics, beside the polls: a consumer of a missing
	// topic would wait silently.
	checkCtx, stopCheck := context.WithCancel(ctx)
	checkDone := make(chan struct{})
	go func() {
		defer close(checkDone)
		c.warnMissingTopics(checkCtx, cl)
	}()
	defer func() { stopCheck(); <-checkDone }() // before the client is closed

	failedPolls := 0 // consecutive polls that returned only errors
	// anew is when each topic was last consumed anew (see consumeAnew).
	anew := map[string]time.Time{}
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if c.hasPending() {
			// Come back soon to retry the commit even if no record arrives.
			pctx, cancel = context.WithTimeout(ctx, pendingRetry)
		}
		fs := cl.PollRecords(pctx, c.cfg.MaxPollRecords)
		cancel()
		if fs.IsClientClosed() {
			cl.AllowRebalance()
			return fmt.Errorf("idemkafka: %w", kgo.ErrClientClosed)
		}
		if len(fs) == 0 && ctx.Err() == nil {
			// kgo returns no fetch at all only when the data it woke up
			// for was taken away (a rebalance purged it), and then
			// without blocking rebalances: a revoke may run right now,
			// so this is no time to commit (the pending commits would
			// race onRevoked and could be put back for partitions no
			// longer owned). Every other return blocks them.
			cl.AllowRebalance()
			continue
		}
		fetchErr := false
		var (
			fenced, refused error
			gone            []string // topics the brokers no longer know by their IDs
		)
		fs.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			if errors.Is(err, kerr.FencedInstanceID) {
				fenced = err
				return
			}
			if errors.Is(err, kerr.InvalidSessionTimeout) {
				refused = err
				return
			}
			fetchErr = true
			if errors.Is(err, kerr.UnknownTopicID) && topic != "" && !slices.Contains(gone, topic) {
				gone = append(gone, topic)
			}
			if isGroupFailure(topic, err) {
				c.logGroupFailure(topic, partition, err)
				return
			}
			c.logPartitionFailure(topic, partition, err, time.Now())
		})
		if refused != nil {
			// The group will never take this member: a configuration
			// mistake, not a passing failure.
			cl.AllowRebalance()
			timeout, _ := cl.OptValue(kgo.SessionTimeout).(time.Duration)
			return fmt.Errorf("idemkafka: group %q refuses the session timeout %v (kgo.SessionTimeout): "+
				"it must lie within the brokers' group.min.session.timeout.ms and group.max.session.timeout.ms: %w", c.cfg.Group, timeout, refused)
		}
		if fenced != nil {
			// Another instance has this one's ID and its partitions. kgo
			// would join again and fence it in turn: stop instead, and
			// leave this poll's records to it (their offsets cannot be
			// committed by a fenced member; the inbox drops any that were
			// applied).
			cl.AllowRebalance()
			c.cfg.Logger.Error("idemkafka: consumer stopped: another consumer joined the group with this instance ID; give every instance its own InstanceID",
				"group", c.cfg.Group, "instance_id", c.instanceID, "consumer", c.in.Consumer(), "err", fenced)
			return fmt.Errorf("%w (group %q, instance ID %q): %w", ErrFenced, c.cfg.Group, c.instanceID, fenced)
		}
		gaveUp := c.cycle(ctx, cl, fs)
		cl.AllowRebalance()
		if c.rejoined.Swap(false) && ctx.Err() == nil {
			c.resync(cl)
		}
		if len(gone) > 0 && ctx.Err() == nil {
			c.consumeAnew(cl, gone, anew)
		}
		if ctx.Err() != nil {
			// The stop's cycle has just tried the pending commits:
			// another try in the revoke of Close would wait for a
			// failing coordinator as long again.
			c.pendingMu.Lock()
			clear(c.pending)
			c.pendingMu.Unlock()
			c.cfg.Logger.Info("idemkafka: consumer stopping", "group", c.cfg.Group, "consumer", c.in.Consumer())
			return nil
		}
		// A fatal fetch error (authorization, say) comes back at every
		// poll: do not spin on it.
		if fetchErr && fs.NumRecords() == 0 {
			failedPolls++
			backoff.Sleep(ctx, backoff.Jitter(c.cfg.Retry.Backoff(failedPolls)), fencedCh)
		} else {
			failedPolls = 0
		}
		if gaveUp {
			// A partition was rewound after its last failed try (the
			// database or the dead-letter topic is down): pause as
			// after any failed try, with the rebalance allowed, before
			// the next poll tries it again at once. Without it, a
			// Retry.Attempts of 1 retried in a tight loop.
			backoff.Sleep(ctx, backoff.Jitter(c.cfg.Retry.Backoff(c.cfg.Retry.Attempts)), fencedCh)
		}
	}
}

// resync makes cl consume the consumer's topics anew, from the group's
// committed offsets: the group dropped this member while a poll was in
// flight and it joined again under a new member ID, and kgo kept the
// fetch positions of the old membership for the partitions it got back,
// although another member consumed and committed them meanwhile (or the
// old membership's commits failed). The records between the group's
// offsets and those positions are delivered again; the inbox skips them,
// and their offsets are committed under the new membership.
func (c *Consumer[TTx]) resync(cl *kgo.Client) {
	c.pendingMu.Lock()
	clear(c.pending)
	c.pendingMu.Unlock()
	c.fetchMember.Store(nil) // the next assignment's
	c.cfg.Logger.Info("idemkafka: the group dropped this member during a poll (a batch longer than the rebalance timeout) and it joined again: consuming its topics anew from the group's offsets",
		"group", c.cfg.Group, "topics", c.cfg.Topics)
	cl.PurgeTopicsFromConsuming(c.cfg.Topics...)
	cl.AddConsumeTopics(c.cfg.Topics...)
}

// consumeAnewInterval is the least time between two purges of one topic
// by consumeAnew: a broker that does not know a topic's ID yet (its
// metadata lagging) answers UNKNOWN_TOPIC_ID too, for a while.
const consumeAnewInterval = 10 * time.Second

// consumeAnew makes cl consume topics anew, the brokers no longer knowing
// them by the IDs cl fetches them with (UNKNOWN_TOPIC_ID: deleted, and
// maybe created again by an operator fixing its partitions or settings).
// kgo fetches a topic by the ID it first learned and never consumes a new
// instance of it (franz-go's README, "Topic recreation"): the consumer
// failed every fetch of it, logging each, until restarted, and the new
// topic's records waited. Purged and added again, the topic is consumed
// from the group's offsets for it, which Kafka deleted with the topic: so
// from its start (ConsumeResetOffset), once it exists. The commits left
// pending for it (offsets of the old instance) are dropped first: landing
// on the new one, they would skip its records. anew (when each topic was
// last purged) limits it to one purge per topic every consumeAnewInterval.
func (c *Consumer[TTx]) consumeAnew(cl *kgo.Client, topics []string, anew map[string]time.Time) {
	now := time.Now()
	topics = slices.DeleteFunc(topics, func(t string) bool { return now.Sub(anew[t]) < consumeAnewInterval })
	if len(topics) == 0 {
		return
	}
	for _, t := range topics {
		anew[t] = now
	}
	c.pendingMu.Lock()
	for k := range c.pending {
		if slices.Contains(topics, k.topic) {
			delete(c.pending, k)
		}
	}
	c.pendingMu.Unlock()
	cl.PurgeTopicsFromConsuming(topics...)
	cl.AddConsumeTopics(topics...)
	c.cfg.Logger.Warn("idemkafka: the brokers no longer know the topics by their IDs (deleted, maybe created again): consuming them anew, from the group's offsets, or from their start once they exist",
		"group", c.cfg.Group, "topics", topics)
}

// fenceHook signals ch when the group session ends because another member
// joined with this member's instance ID.
type fenceHook chan<- struct{}

// OnGroupManageError implements kgo.HookGroupManageError.
func (h fenceHook) OnGroupManageError(err error) {
	if errors.Is(err, kerr.FencedInstanceID) {
		select {
		case h <- struct{}{}:
		default:
		}
	}
}

// cycle applies one poll, partition by partition, commits the offsets of
// what committed in the database, and rewinds every partition to its first
// record that was not handled. It runs with the rebalance blocked, so the
// partitions it commits are still owned. It reports whether a partition
// was rewound while ctx was live: the database or the dead-letter topic
// kept failing.
func (c *Consumer[TTx]) cycle(ctx context.Context, cl *kgo.Client, fs kgo.Fetches) (gaveUp bool) {
	parts := partitions(fs)
	if len(parts) == 0 && !c.hasPending() {
		return false
	}
	// The membership these records were fetched under (see pendingCommit).
	member := c.fetchMembership(cl)
	// A transaction started is finished even if ctx ends meanwhile; a
	// Begin still waiting (an exhausted pool, a server that does not
	// answer) ends with ctx.
	work := txbegin.WithStop(context.WithoutCancel(ctx), ctx)
	var (
		commits []*kgo.Record
		rewinds = map[string]map[int32]kgo.EpochOffset{}
		stats   = make([]BatchStats, len(parts))
	)
	for i, p := range parts {
		started := time.Now()
		done := 0
		if ctx.Err() == nil {
			done, stats[i] = c.partition(ctx, work, cl, p)
		}
		// The partition's own time; the commit, shared, is added below.
		stats[i].Duration = time.Since(started)
		if ctx.Err() == nil {
			c.trackStall(p, started, done, stats[i])
		}
		stats[i].Topic, stats[i].Partition, stats[i].Records = p.Topic, p.Partition, len(p.Records)
		if done > 0 {
			commits = append(commits, p.Records[done-1])
		}
		if done < len(p.Records) {
			gaveUp = gaveUp || ctx.Err() == nil
			r := p.Records[done]
			stats[i].Rewound = len(p.Records) - done
			if rewinds[r.Topic] == nil {
				rewinds[r.Topic] = map[int32]kgo.EpochOffset{}
			}
			rewinds[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		}
	}
	if len(rewinds) > 0 {
		// Before AllowRebalance, so the partitions are still ours; the
		// next poll returns these records again.
		cl.SetOffsets(rewinds)
	}

	commits = c.withPending(commits, member)
	var (
		commitErr  error
		commitTime time.Duration
	)
	if len(commits) > 0 {
		if c.hooks.beforeCommit != nil {
			c.hooks.beforeCommit(commits)
		}
		started := time.Now()
		cctx, cancel := commitContext(ctx, work)
		commitErr = cl.CommitRecords(sameMember(cctx, member), commits...)
		cancel()
		commitTime = time.Since(started)
		if errors.Is(commitErr, errMemberChanged) {
			c.rejoined.Store(true)
		}
		c.settlePending(commits, commitErr, member)
		c.logCommit(commitErr)
	}
	if c.cfg.OnBatch == nil {
		return gaveUp
	}
	for i := range stats {
		s := &stats[i]
		s.Committed = commitErr == nil && s.Records > s.Rewound
		if commitErr != nil && s.Err == nil {
			s.Err = commitErr
		}
		s.Duration += commitTime
		c.cfg.OnBatch(ctx, *s)
	}
	return gaveUp
}

// commitContext returns the context of a poll's offset commit, derived from
// work (which ignores ctx's end): it ends after commitTimeout, or
// stopCommitGrace after ctx ends, whichever comes first.
func commitContext(ctx, work context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithTimeout(work, commitTimeout)
	var (
		mu    sync.Mutex
		done  bool
		timer *time.Timer
	)
	unregister := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			timer = time.AfterFunc(stopCommitGrace, cancel)
		}
	})
	return cctx, func() {
		unregister()
		mu.Lock()
		done = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// errMemberChanged refuses an offset commit that kgo would send under
// another group member ID than the one its records were fetched under.
var errMemberChanged = errors.New("idemkafka: the group dropped this member and it joined again: the offsets fetched under its old membership are not committed")

// sameMember returns ctx for an offset commit of records fetched under
// member (see fetchMembership): kgo waits for a join in progress before it
// commits, and then commits under the membership it joined with, which,
// for a member the group had dropped, is a new one (see pendingCommit).
// The commit is not sent then.
func sameMember(ctx context.Context, member string) context.Context {
	return kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		if req.MemberID != member {
			return errMemberChanged
		}
		return nil
	})
}

// fetchMembership returns the group member ID the records of a poll
// were fetched under: the one of the first assignment since Run started,
// the partitions were lost or the consumer resynced. kgo keeps its fetch
// positions and the records it buffered when the group drops the member
// during a poll and it joins again under a new ID (no OnPartitionsLost):
// a poll right after that join returns records fetched under the old
// membership (for partitions the new one may not even own) while
// kgo.Client.GroupMetadata already names the new ID. Committed under it,
// they moved the group's offsets back (see pendingCommit).
func (c *Consumer[TTx]) fetchMembership(cl *kgo.Client) string {
	if m := c.fetchMember.Load(); m != nil {
		return *m
	}
	m, _ := cl.GroupMetadata()
	return m
}

// pendingCommit is a pending record and the group member ID it was
// fetched under (see fetchMembership). A member the group dropped while a
// poll was in flight (a handler slower than the rebalance timeout) joins
// again under a new member ID, and kgo does not call OnPartitionsLost on
// that path: another member has meanwhile consumed its partitions and
// committed them further. A commit of the old membership's record under
// the new one would move the group's offset back to it, and with no newer
// record in the partition the consumer lag would stay there until the
// next rebalance, which delivers the records once more. So a pending
// record is committed only under the membership it was fetched under.
type pendingCommit struct {
	rec    *kgo.Record
	member string
}

// withPending adds to commits the pending record of every partition that
// has no newer record in commits, and drops the pending records of another
// membership than member's.
func (c *Consumer[TTx]) withPending(commits []*kgo.Record, member string) []*kgo.Record {
	c.pendingMu.Lock()
	defer c.pendingMu.Unlock()
	if len(c.pending) == 0 {
		return commits
	}
	have := make(map[topicPartition]bool, len(commits))
	for _, r := range commits {
		have[topicPartition{r.Topic, r.Partition}] = true
	}
	for k, p := range c.pending {
		switch {
		case p.member != member:
			delete(c.pending, k)
			c.rejoined.Store(true)
		case !have[k]:
			commits = append(commits, p.rec)
		}
	}
	return commits
}

// settlePending records the outcome of committing commits, polled under
// member: on success their partitions have nothing pending; on failure
// each waits with its record for the next try.
func (c *Consumer[TTx]) settlePending(commits []*kgo.Record, err error, member string) {
	c.pendingMu.Lock()
	defer c.pendingMu.Unlock()
	for _, r := range commits {
		k := topicPartition{r.Topic, r.Partition}
		if err == nil {
			delete(c.pending, k)
			continue
		}
		if c.pending == nil {
			c.pending = map[topicPartition]pendingCommit{}
		}
		c.pending[k] = pendingCommit{rec: r, member: member}
	}
}

func (c *Consumer[TTx]) hasPending() bool {
	c.pendingMu.Lock()
	defer c.pendingMu.Unlock()
	return len(c.pending) > 0
}

// takePending removes the pending records of ps and returns those polled
// under member (see pendingCommit).
func (c *Consumer[TTx]) takePending(ps map[string][]int32, member string) []*kgo.Record {
	c.pendingMu.Lock()
	defer c.pendingMu.Unlock()
	var out []*kgo.Record
	for topic, parts := range ps {
		for _, p := range parts {
			k := topicPartition{topic, p}
			if r, ok := c.pending[k]; ok {
				if r.member == member {
					out = append(out, r.rec)
				}
				delete(c.pending, k)
			}
		}
	}
	return out
}

// trackStall records what a poll did to partition p, whose records it
// started applying at started and of which it handled the first done: a
// partition that applied nothing (its first record failed every try on a
// database or dead-letter topic fault, and was rewound) is stalled from
// the first such poll until one applies a record. It is logged at ERROR
// once it has been stalled c.stallAfter, then every c.stallAfter while it
// lasts (the per-try warnings are at DEBUG meanwhile), and at INFO when it
// moves again.
func (c *Consumer[TTx]) trackStall(p kgo.FetchTopicPartition, started time.Time, done int, st BatchStats) {
	if done > 0 && c.nStalls.Load() == 0 {
		return
	}
	k := topicPartition{p.Topic, p.Partition}
	c.stallMu.Lock()
	defer c.stallMu.Unlock()
	s := c.stalls[k]
	if done > 0 {
		if s == nil {
			return
		}
		delete(c.stalls, k)
		c.nStalls.Store(int32(len(c.stalls)))
		if !s.logged.IsZero() {
			c.cfg.Logger.Info("idemkafka: partition moves again",
				"group", c.cfg.Group, "consumer", c.in.Consumer(), "topic", p.Topic, "partition", p.Partition,
				"offset", p.Records[0].Offset, "stalled_for", time.Since(s.since).Round(time.Millisecond), "tries", s.tries)
		}
		return
	}
	if s == nil {
		if c.stalls == nil {
			c.stalls = map[topicPartition]*stall{}
		}
		s = &stall{since: started}
		c.stalls[k] = s
		c.nStalls.Store(int32(len(c.stalls)))
	}
	s.tries += st.Failures
	now := time.Now()
	if now.Sub(s.since) < c.stallAfter || (!s.logged.IsZero() && now.Sub(s.logged) < c.stallAfter) {
		return
	}
	s.logged = now
	r := st.stuck
	if r == nil {
		r = p.Records[0]
	}
	var id string
	if e, err := Envelope(r); err == nil {
		id = e.ID.String()
	}
	c.cfg.Logger.Error("idemkafka: partition stalled: its next record keeps failing on a database (or dead-letter topic) fault, which is retried, never dead-lettered; "+
		"it waits until the fault passes (a lock held by a stuck transaction, a statement over statement_timeout, the database down)",
		"group", c.cfg.Group, "consumer", c.in.Consumer(), "topic", p.Topic, "partition", p.Partition,
		"offset", r.Offset, "event_id", id, "stalled_for", now.Sub(s.since).Round(time.Millisecond), "tries", s.tries, "err", st.Err)
}

// stalled reports whether the partition is stalled: a poll gave up on it
// and none has applied a record of it since.
func (c *Consumer[TTx]) stalled(topic string, partition int32) bool {
	if c.nStalls.Load() == 0 {
		return false
	}
	c.stallMu.Lock()
	defer c.stallMu.Unlock()
	return c.stalls[topicPartition{topic, partition}] != nil
}

// stallReported reports whether the partition is stalled and was logged
// at ERROR.
func (c *Consumer[TTx]) stallReported(topic string, partition int32) bool {
	if c.nStalls.Load() == 0 {
		return false
	}
	c.stallMu.Lock()
	defer c.stallMu.Unlock()
	s := c.stalls[topicPartition{topic, partition}]
	return s != nil && !s.logged.IsZero()
}

// clearStalls forgets the stalls of ps (all of them if ps is nil): the
// partitions are no longer owned, and their next owner tracks them.
func (c *Consumer[TTx]) clearStalls(ps map[string][]int32) {
	c.stallMu.Lock()
	defer c.stallMu.Unlock()
	if ps == nil {
		clear(c.stalls)
	}
	for topic, parts := range ps {
		for _, p := range parts {
			delete(c.stalls, topicPartition{topic, p})
		}
	}
	c.nStalls.Store(int32(len(c.stalls)))
}

// Stalled returns how long the longest-stalled partition this consumer
// owns has gone without progress: from the start of the first poll that
// applied none of its records (every try of its next record failed on a
// database or dead-letter topic fault, retried for ever and never
// dead-lettered) until now; 0 when every partition moved on at its last
// poll. It grows between polls, so a gauge read at scrape time alerts on a
// partition stuck behind one record even while a try of it runs. Safe
// for concurrent use.
func (c *Consumer[TTx]) Stalled() time.Duration {
	if c.nStalls.Load() == 0 {
		return 0
	}
	c.stallMu.Lock()
	defer c.stallMu.Unlock()
	var worst time.Duration
	for _, s := range c.stalls {
		worst = max(worst, time.Since(s.since))
	}
	return worst
}

// partitions returns the non-empty partitions of fs, each once, with its
// records in offset order.
func partitions(fs kgo.Fetches) []kgo.FetchTopicPartition {
	type key struct {
		topic     string
		partition int32
	}
	var (
		out []kgo.FetchTopicPartition
		idx = map[key]int{}
	)
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		k := key{p.Topic, p.Partition}
		if i, ok := idx[k]; ok {
			out[i].Records = slices.Concat(out[i].Records, p.Records)
			return
		}
		idx[k] = len(out)
		out = append(out, p)
	})
	return out
}

func (c *Consumer[TTx]) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	member, _ := cl.GroupMetadata()
	if old := c.fetchMember.Load(); old == nil {
		c.fetchMember.Store(&member)
	} else if *old != member {
		// Dropped and joined again without a loss of the partitions:
		// the fetch positions kgo kept are the old membership's.
		c.rejoined.Store(true)
	}
	c.logGroupJoined()
	c.cfg.Logger.Info("idemkafka: partitions assigned", "group", c.cfg.Group, "partitions", assigned)
	if c.userAssigned != nil {
		c.userAssigned(ctx, cl, assigned)
	}
}

// onRevoked runs while no batch is in flight (BlockRebalanceOnPoll): every
// cycle committed what it applied, except offsets whose commit failed; those
// get a last try here, while the partitions are still ours (not when Run
// stops: its last cycle has just tried them). If it fails too, the next
// owner gets the records again and its inbox skips them.
func (c *Consumer[TTx]) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if len(revoked) > 0 {
		c.cfg.Logger.Info("idemkafka: partitions revoked", "group", c.cfg.Group, "partitions", revoked)
	}
	c.clearStalls(revoked)
	member, _ := cl.GroupMetadata()
	if recs := c.takePending(revoked, member); len(recs) > 0 {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
		if err := cl.CommitRecords(sameMember(cctx, member), recs...); err != nil {
			level := slog.LevelWarn
			if rebalanceRefusal(err) {
				level = slog.LevelInfo
			}
			c.cfg.Logger.Log(ctx, level, "idemkafka: offset commit of revoked partitions failed; the next owner skips the redelivered records",
				"group", c.cfg.Group, "err", err)
		}
		cancel()
	}
	if c.userRevoked != nil {
		c.userRevoked(ctx, cl, revoked)
	}
}

// onLost: the membership is gone (session expired, fenced); commits would
// fail. Applied records whose offsets were not committed are redelivered to
// the new owner and skipped by the inbox. kgo also calls it at every failed
// try of its group loop (a broker outage), with what the member holds:
// nothing after the first; that is not logged (the failure itself is, as a
// fetch error).
func (c *Consumer[TTx]) onLost(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
	if len(lost) > 0 {
		c.cfg.Logger.Warn("idemkafka: partitions lost", "group", c.cfg.Group, "partitions", lost)
	}
	c.takePending(lost, "")
	c.clearStalls(lost)
	// kgo drops every fetch position after a loss: the next assignment
	// starts a membership of its own.
	c.fetchMember.Store(nil)
	if c.userLost != nil {
		c.userLost(ctx, cl, lost)
	}
}

func (c *Consumer[TTx]) onBlocked(ctx context.Context, cl *kgo.Client) {
	c.cfg.Logger.Debug("idemkafka: a rebalance waits for the batch in flight", "group", c.cfg.Group)
	if c.userBlocked != nil {
		c.userBlocked(ctx, cl)
	}
}

// warnMissingTopics asks the brokers once, at start, which of the
// consumer's topics they have, and WARNs about those they do not: kgo
// consumes a missing topic by waiting for it, without an error. A failed
// request is tried again (1 s to 30 s apart) until one is answered or ctx
// ends. The request asks for auto-creation only when the client does
// (kgo.AllowAutoTopicCreation), as the client's own metadata requests do;
// the dead-letter topics are looked at only when it does not (then a
// missing one would hold its partition at the first dead letter; asking
// about them with auto-creation would create them).
func (c *Consumer[TTx]) warnMissingTopics(ctx context.Context, cl *kgo.Client) {
	auto, _ := cl.OptValue(kgo.AllowAutoTopicCreation).(bool)
	topics := slices.Clone(c.cfg.Topics)
	dlqs := map[string]bool{}
	if !auto {
		for _, t := range c.cfg.Topics {
			if d := c.cfg.deadLetterTopic(t); !slices.Contains(topics, d) {
				topics = append(topics, d)
				dlqs[d] = true
			}
		}
	}
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	req.AllowAutoTopicCreation = auto
	var resp *kmsg.MetadataResponse
	for attempt := 1; ; attempt++ {
		var err error
		if resp, err = req.RequestWith(ctx, cl); err == nil {
			break
		}
		if !backoff.Sleep(ctx, backoff.Exp(attempt, time.Second, 30*time.Second), nil) {
			return
		}
	}
	var missing, missingDLQ []string
	for _, t := range resp.Topics {
		if t.Topic == nil || !errors.Is(kerr.ErrorForCode(t.ErrorCode), kerr.UnknownTopicOrPartition) {
			continue
		}
		if dlqs[*t.Topic] {
			missingDLQ = append(missingDLQ, *t.Topic)
		} else {
			missing = append(missing, *t.Topic)
		}
	}
	const fix = "create them, or enable auto-creation (auto.create.topics.enable on the broker, and kgo.AllowAutoTopicCreation in ExtraOpts)"
	if len(missing) > 0 {
		c.cfg.Logger.Warn("idemkafka: the brokers do not have topics this consumer subscribes to; it waits for them and consumes nothing of them: "+fix,
			"group", c.cfg.Group, "topics", missing, "consumer", c.in.Consumer())
	}
	if len(missingDLQ) > 0 {
		c.cfg.Logger.Warn("idemkafka: the brokers do not have this consumer's dead-letter topics; a record that fails for good holds its partition until they exist: "+fix,
			"group", c.cfg.Group, "topics", missingDLQ, "consumer", c.in.Consumer())
	}
}

// OffsetResets returns how many times a partition's fetch found the
// records at the consumer's offset gone (OFFSET_OUT_OF_RANGE: deleted by
// retention or DeleteRecords before they were applied, or lost by the
// broker) and kgo resumed it per ConsumeResetOffset (the log start by
// default), skipping the records in between: each is data loss, logged at
// ERROR. It counts from the consumer's creation, across Runs, for a
// counter to alert on (any increase). Safe for concurrent use.
func (c *Consumer[TTx]) OffsetResets() int64 { return c.resets.Load() }

// resetLogger is the consumer client's kgo.Logger: it passes every line
// on to the logger given in ExtraOpts (kgo.WithLogger), if any, at the
// level that one asks for, and logs at ERROR (and counts in resets)
// kgo's lines about an OFFSET_OUT_OF_RANGE fetch. kgo resumes such a
// partition per ConsumeResetOffset (the log start by default) without an
// error: the records between the group's offset and the log start
// (deleted by retention before the group consumed them, or lost by the
// broker) were skipped without a word. kgo logs them at INFO or WARN,
// with the topic, the partition and the offset the group was at; it logs
// at INFO only about connections, metadata, group changes and failures,
// never per record or per fetch, so asking for INFO costs nothing per
// record.
type resetLogger struct {
	inner  kgo.Logger
	log    *slog.Logger
	group  string
	resets *atomic.Int64
}

func (l resetLogger) Level() kgo.LogLevel {
	if l.inner != nil && l.inner.Level() > kgo.LogLevelInfo {
		return l.inner.Level()
	}
	return kgo.LogLevelInfo
}

func (l resetLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if strings.HasPrefix(msg, "received OFFSET_OUT_OF_RANGE") {
		l.resets.Add(1)
		l.log.Error("idemkafka: OFFSET_OUT_OF_RANGE: the partition no longer has the records at the consumer's offset (deleted by retention or DeleteRecords before they were applied, or lost by the broker); "+
			"consuming resumes per ConsumeResetOffset (the log start by default): the records in between are skipped, never applied",
			append([]any{"group", l.group, "kgo", msg}, keyvals...)...)
	}
	if l.inner != nil && level <= l.inner.Level() {
		l.inner.Log(level, msg, keyvals...)
	}
}
