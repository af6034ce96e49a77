package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/backoff"
)

// DeadLetterSuffix is appended to a record's topic to name its dead-letter
// topic when ConsumerConfig.DeadLetterTopic is empty.
const DeadLetterSuffix = ".dlq"

// DefaultTxTimeout is ConsumerConfig.TxTimeout's default.
const DefaultTxTimeout = time.Minute

// ConsumerConfig configures a Consumer. TTx is the transaction type of the
// driver; the handler receives the transaction its effects must be written
// through.
type ConsumerConfig[TTx any] struct {
	// Seeds are the seed brokers, host:port (no spaces, port 1 to 65535).
	// Required.
	Seeds []string
	// Group is the Kafka consumer group. Defaults to the inbox's consumer
	// name (inbox.Config.Consumer), so that one name identifies the
	// consumer in Kafka and in processed_event; set it only to join a group
	// named otherwise. Every instance of one consumer uses the same group
	// and the same inbox.
	Group string
	// Topics are the topics to consume. Required. They must exist (with
	// their dead-letter topics), unless the cluster creates topics on
	// demand and ExtraOpts has kgo.AllowAutoTopicCreation(): a consumer of
	// a missing topic waits for it. Run WARNs once, at start, naming the
	// topics (and, without auto-creation, dead-letter topics) the brokers
	// do not have; to refuse to start instead, call CheckTopics with
	// RequiredTopics before Run.
	Topics []string

	// Handler applies one new event: it writes the event's effects (and any
	// follow-up events, through outbox.EnqueueTx) through tx, and only
	// through tx. It runs once per event ID for the inbox's consumer name,
	// inside the transaction that records the ID. It is never called for a
	// duplicate. It is called again for the same event whenever its
	// transaction rolled back: it failed (or panicked), a later event of
	// the same batch failed, or the commit failed. It is called from one
	// goroutine per Consumer. ctx carries the values of
	// Run's context but is not cancelled with it: a transaction in flight
	// is finished when the consumer stops. It ends after TxTimeout.
	// Exactly one of Handler and BatchHandler is required.
	Handler func(ctx context.Context, tx TTx, e event.Envelope) error

	// BatchHandler, instead of Handler, applies all the new events of a
	// partition batch with one call: events are the batch's records that
	// are not duplicates (first copy of each event ID), in offset order,
	// and the handler writes their effects through tx, typically with one
	// bulk statement (a multi-row INSERT, COPY), which is much faster than
	// a statement per event. It runs inside the transaction that records
	// the events' IDs (inbox.ProcessBulk) and is never called with an
	// empty slice.
	//
	// If it fails (or panics), the transaction rolls back. A database's
	// passing failure (a deadlock, a lock timeout, a lost connection: the
	// errors Handler's failures are retried on, not counted against the
	// record) retries the same batch whole after a backoff. Any other
	// error cannot say which event was at fault, so the batch's records are
	// then applied one at a time, each in a transaction of its own with a
	// one-event slice: a record that fails alone is retried and
	// dead-lettered exactly as with Handler (Retry, ErrPoison), and the
	// others are applied; then the partition goes back to whole batches.
	// A BatchHandler that returns ErrPoison for a whole batch thus only
	// dead-letters the records that return it alone. Everything said of
	// Handler (tx only, called again after a rollback, one goroutine, ctx)
	// holds for BatchHandler. events may be kept after the call.
	BatchHandler func(ctx context.Context, tx TTx, events []event.Envelope) error

	// TxTimeout bounds each of the consumer's database transactions: its
	// Begin, the handler's calls and the COMMIT of one partition's batch
	// (the COMMIT gets 5 s more if it started in time). The handler's ctx
	// ends then; the transaction is rolled back, its connection closed,
	// and the batch retried with backoff as a database failure, never
	// dead-lettered (a handler's HTTP call ended by it is the record's
	// failure, as any HTTP error). It is what ends a transaction whose
	// connection stopped answering without being closed (a network
	// partition, a failover behind a load balancer or NAT, a firewall
	// that lost the connection's state), which otherwise waits as long as
	// TCP retransmits (about 15 minutes on Linux; for ever behind a
	// middlebox that acknowledges): the partition, and every other
	// partition of the consumer, applied nothing meanwhile, logged
	// nothing, and Run did not return when its context ended. Keep it
	// above the longest batch the handler takes, and below the group's
	// rebalance timeout (kgo.RebalanceTimeout, 1 minute by default): the
	// consumer holds rebalances while it applies a poll. Defaults to 1
	// minute; negative is an error.
	TxTimeout time.Duration

	// MaxPollRecords is the most records one poll returns, over all
	// partitions. Each partition's share is applied in one database
	// transaction. Defaults to 500.
	MaxPollRecords int

	// Retry bounds the attempts on a failing record and on a failing
	// database. See Retry for the defaults.
	Retry Retry

	// DeadLetterTopic receives the records that cannot be applied: those
	// that are not valid idem events, and those whose handler failed
	// Retry.Attempts times (or returned an error wrapping ErrPoison). The
	// copy keeps the original key, value and headers and adds the headers
	// HeaderDLQError, HeaderDLQTopic, HeaderDLQPartition, HeaderDLQOffset,
	// HeaderDLQConsumer, HeaderDLQAttempts and HeaderDLQTimestamp (the
	// original's timestamp: the copy is stamped when it is dead-lettered,
	// so the topic's retention counts from then). The topic must exist (or
	// the cluster must create topics on demand): until the copy is
	// acknowledged the record's partition does not move on. The consumer
	// waits at most 30 s for one acknowledgement (then backs off, retries,
	// and after Retry.Attempts rewinds the partition and polls again), and
	// its other partitions wait meanwhile: alert on the dead-letter topic's
	// health. Stopping the consumer does not wait for an acknowledgement.
	// Defaults to the record's topic followed by DeadLetterSuffix
	// ("orders.dlq").
	DeadLetterTopic string

	// InstanceID turns on static group membership: it is this instance's
	// identity in the group, the same across its restarts and different
	// for every instance that runs at the same time (a StatefulSet pod's
	// name, a host name). The default, empty, is dynamic membership.
	//
	// A static member that restarts (a crash, a rolling deploy) gets its
	// partitions back as soon as it rejoins, with no rebalance and without
	// waiting for its old session to expire; the other members keep
	// consuming throughout. In exchange, a static member that stops does
	// not leave the group (kgo's one exception: it closes between revoking
	// partitions in a cooperative rebalance and joining again): its
	// partitions are not consumed until it comes back or its session times
	// out (kgo.SessionTimeout in ExtraOpts, which should outlast a
	// restart), and only then move to the others. Use it where instances
	// come back under the same name.
	//
	// Two instances must never share an ID. If one joins with the ID of
	// another that is running, the broker hands the partitions to the new
	// one and fences the old one: its Run returns an error wrapping
	// ErrFenced instead of joining again and taking them back (which the
	// other would do in turn, for ever). Nothing is applied twice either
	// way: the inbox drops redeliveries.
	//
	// The ID must be 1 to 249 characters among ASCII letters, digits, '.',
	// '_' and '-' (Kafka's rule for group.instance.id). kgo.InstanceID in
	// ExtraOpts does the same; setting both to different IDs is an error.
	// All of this is the classic group protocol's (kgo's default): an
	// InstanceID with kgo.ServerSideBalancer (KIP-848, whose broker
	// refuses the newcomer instead, and keeps a crashed member's ID until
	// its session ends) is refused with ErrUnsupportedOption.
	InstanceID string

	// ExtraOpts are more kgo options for the consumer's client (TLS, SASL,
	// a logger, session timeouts, ...). The consumer reads committed
	// records only (FetchIsolationLevel(ReadCommitted()): events of a
	// transaction its producer aborted are never applied) and fetches with
	// FetchMaxWait(DefaultFetchMaxWait), 500 ms, instead of kgo's 5 s
	// (the partitions a rebalance hands over are fetched once the fetch
	// in flight returns, so a member that dies is taken over at once),
	// and reads the cluster's metadata every DefaultMetadataMaxAge, 10 s,
	// instead of kgo's 5 minutes (partitions added to a topic are handed
	// out only then); an option here may change any of them. Keep kgo's
	// default ConsumeResetOffset, the log start: a partition without a
	// committed offset (one added to the topic, or a group whose offsets
	// expired or were deleted) is then consumed from its first record, the
	// inbox dropping what it applied already; at the end, the records
	// written there before the group took the partition are skipped, and
	// Run WARNs at start (kgo.NewOffset().AfterMilli starts a new group at
	// a time, and new partitions at their start).
	// The consumer sets the seeds, the
	// group, the topics, DisableAutoCommit and BlockRebalanceOnPoll after
	// them, so those cannot be overridden. OnPartitionsAssigned, Revoked,
	// Lost and CallbackBlocked callbacks given here are called by the
	// consumer's own callbacks; do not commit offsets in them. Options
	// that would break the consumer's guarantees are rejected by
	// NewConsumer: ConsumeRegex, ConsumePartitions, ShareGroup (a KIP-932
	// share group has no offsets per partition to commit after the
	// inbox's transaction), TransactionalID,
	// KeepControlRecords (every transaction marker would be polled as a
	// record and dead-lettered), DefaultProduceTopicAlways (every dead
	// letter would go to one topic, maybe the consumed one; with or
	// without a DefaultProduceTopic), ManualFlushing
	// (dead letters would never be sent), and anything weakening the producer that writes dead letters
	// (DisableIdempotentWrite, RequiredAcks other than AllISRAcks,
	// AllowIdempotentProduceCancellation). The consumer group protocol
	// tested is the classic one (kgo's default); KIP-848's
	// ServerSideBalancer is untested.
	ExtraOpts []kgo.Opt

	// Logger receives warnings (retries, rewinds, failed offset commits,
	// dead letters) and debug messages. Defaults to slog.Default(). A
	// failure to join the group (the brokers unreachable), which kgo tries
	// again every few seconds, is logged when it starts, then at most
	// every 30 seconds with the tries not logged, and at INFO when the
	// group is joined again; a fetch error of a topic or partition is
	// logged each time. A partition that applies nothing for a minute (a
	// record failing on a database fault at every try) is logged at ERROR,
	// then every minute while it lasts, instead of at every try.
	Logger *slog.Logger

	// OnBatch, if set, is called once per partition batch, after its
	// offsets were committed (or failed to), with what the batch did: for
	// metrics of processed, duplicate and dead-lettered events. It runs on
	// the consumer's goroutine and must be fast.
	OnBatch func(ctx context.Context, s BatchStats)
}

// Retry bounds retries. The zero value gives the defaults.
type Retry struct {
	// Attempts is how many times a record whose handler fails is tried
	// before it is dead-lettered, the first try included; and how many
	// times a batch is tried when the database fails before the consumer
	// gives up for this poll, rewinds the partition and, after one more
	// backoff (Backoff(Attempts)), polls again (so a database outage never
	// skips a record: it only slows the partition down); the later polls
	// of a partition that a poll gave up on try it once each, until it
	// moves. Defaults to 5.
	Attempts int
	// Backoff returns the pause before retry n (n >= 1 is the number of
	// failed tries so far). Defaults to DefaultBackoff. The consumer waits
	// a random duration between half of it and all of it, so replicas that
	// failed together (a database outage) do not retry together.
	Backoff func(n int) time.Duration
}

// DefaultBackoff is the default Retry.Backoff: 100ms after the first
// failure, doubling after each further one, at most 10s.
func DefaultBackoff(n int) time.Duration {
	return backoff.Exp(n, 100*time.Millisecond, 10*time.Second)
}

// BatchStats is what one partition batch did, as reported to
// ConsumerConfig.OnBatch.
type BatchStats struct {
	// Topic and Partition name the partition.
	Topic     string
	Partition int32
	// Records is how many records the poll returned for the partition.
	Records int
	// Applied events had their handler run and their effects committed.
	Applied int
	// Duplicates were skipped: processed before (a redelivery) or
	// repeated within the batch.
	Duplicates int
	// DeadLettered records were copied to the dead-letter topic and
	// skipped.
	DeadLettered int
	// Failures counts failed tries: handler errors and database (or
	// dead-letter topic) errors, whether tried again or not.
	Failures int
	// Rewound is how many records, at the end of the batch, were not
	// handled because the database (or the dead-letter topic) kept
	// failing or the consumer was stopping: the partition was rewound to
	// the first of them, so they are polled again.
	Rewound int
	// Committed reports whether the offset commit after the batch
	// succeeded (false also when there was nothing to commit). A failed
	// commit is harmless: the records are redelivered and deduplicated.
	Committed bool
	// Err is the last error the batch met (nil if none).
	Err error
	// Duration is the time the partition's records took to apply (the
	// other partitions of the poll, applied before or after them, not
	// included), plus the poll's offset commit, which all its partitions
	// share.
	Duration time.Duration

	// stuck is the record the batch's last database (or dead-letter
	// topic) failure was on.
	stuck *kgo.Record
}

func (c ConsumerConfig[TTx]) withDefaults() ConsumerConfig[TTx] {
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = 500
	}
	if c.TxTimeout == 0 {
		c.TxTimeout = DefaultTxTimeout
	}
	if c.Retry.Attempts == 0 {
		c.Retry.Attempts = 5
	}
	if c.Retry.Backoff == nil {
		c.Retry.Backoff = DefaultBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c ConsumerConfig[TTx]) validate() error {
	var errs []error
	if len(c.Seeds) == 0 {
		errs = append(errs, errors.New("no Seeds: at least one seed broker is required"))
	}
	for _, s := range c.Seeds {
		if err := checkSeed(s); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("no Topics: at least one topic is required"))
	}
	for _, t := range c.Topics {
		if err := CheckTopic(t); err != nil {
			errs = append(errs, fmt.Errorf("in Topics: %w", err))
			continue
		}
		dlq := c.deadLetterTopic(t)
		if err := CheckTopic(dlq); err != nil {
			errs = append(errs, fmt.Errorf("the dead-letter topic of %q: %w", t, err))
		}
		if slices.Contains(c.Topics, dlq) {
			errs = append(errs, fmt.Errorf("the dead-letter topic %q of %q is also consumed", dlq, t))
		}
	}
	switch {
	case c.Handler == nil && c.BatchHandler == nil:
		errs = append(errs, errors.New("no Handler: a Handler or a BatchHandler is required"))
	case c.Handler != nil && c.BatchHandler != nil:
		errs = append(errs, errors.New("both Handler and BatchHandler are set: set exactly one"))
	}
	if c.MaxPollRecords < 0 {
		errs = append(errs, fmt.Errorf("MaxPollRecords %d must not be negative", c.MaxPollRecords))
	}
	if c.TxTimeout < 0 {
		errs = append(errs, fmt.Errorf("TxTimeout %s must not be negative", c.TxTimeout))
	}
	if c.Retry.Attempts < 0 {
		errs = append(errs, fmt.Errorf("Retry.Attempts %d must not be negative", c.Retry.Attempts))
	}
	if c.InstanceID != "" {
		if err := checkName(c.InstanceID); err != nil {
			errs = append(errs, fmt.Errorf("InstanceID %w", err))
		}
	}
	if strings.TrimSpace(c.DeadLetterTopic) != c.DeadLetterTopic {
		errs = append(errs, fmt.Errorf("DeadLetterTopic %q has leading or trailing spaces", c.DeadLetterTopic))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemkafka: invalid ConsumerConfig: %w", err)
	}
	return nil
}

// CheckTopic returns an error unless t is a topic name Kafka accepts: 1 to
// 249 characters among ASCII letters, digits, '.', '_' and '-', and not "."
// or "..". A broker refuses other names for good, so NewConsumer and
// NewPublisher check their topics with it at start-up.
func CheckTopic(t string) error {
	if err := checkName(t); err != nil {
		return fmt.Errorf("topic %w", err)
	}
	return nil
}

// CheckInstanceID returns an error unless id is a group instance ID Kafka
// accepts (ConsumerConfig.InstanceID): the rule of topic names.
func CheckInstanceID(id string) error {
	if err := checkName(id); err != nil {
		return fmt.Errorf("instance ID %w", err)
	}
	return nil
}

// checkName checks a topic name or a group instance ID (Kafka validates
// both with the same rule).
func checkName(t string) error {
	switch {
	case t == "" || t == "." || t == "..":
		return fmt.Errorf("%q: it must not be empty, \".\" or \"..\"", t)
	case len(t) > 249:
		return fmt.Errorf("%q: %d characters, at most 249", t, len(t))
	case strings.ContainsFunc(t, notTopicChar):
		return fmt.Errorf("%q: only ASCII letters, digits, '.', '_' and '-' are allowed", t)
	}
	return nil
}

// notTopicChar reports whether r may not appear in a topic name.
func notTopicChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		return false
	}
	return true
}

// checkSeed returns an error unless s is a host:port (kgo would take ""
// for localhost:9092, and dial for ever a host with spaces, as in
// "kafka-1:9092, kafka-2:9092" split on commas, or a port out of range).
func checkSeed(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || strings.ContainsFunc(host, unicode.IsSpace) || port == "" {
		return fmt.Errorf("seed broker %q: want host:port", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("seed broker %q: port %q: want 1 to 65535", s, port)
	}
	return nil
}

// deadLetterTopic returns where records of topic go when they cannot be
// applied.
func (c ConsumerConfig[TTx]) deadLetterTopic(topic string) string {
	if c.DeadLetterTopic != "" {
		return c.DeadLetterTopic
	}
	return topic + DeadLetterSuffix
}

// Errors returned by NewConsumer and NewPublisher when a kgo option would
// break a guarantee.
var (
	// ErrNotIdempotent: the options disable the idempotent producer
	// (DisableIdempotentWrite), lower acks below all in-sync replicas, or
	// let a context cancel an in-flight idempotent produce
	// (AllowIdempotentProduceCancellation), any of which can lose or
	// duplicate records on a broker retry (rule R-DIST-IDEM-X2).
	ErrNotIdempotent = errors.New("idemkafka: the producer must be idempotent with acks=all")
	// ErrUnsupportedOption: an option conflicts with how idemkafka uses
	// the client (ConsumeRegex, ConsumePartitions, ShareGroup, KeepControlRecords,
	// TransactionalID, DefaultProduceTopicAlways, ManualFlushing,
	// ServerSideBalancer with an InstanceID; for a publisher, a RecordPartitioner that does not
	// keep a key in one partition, and ConsumeTopics or ConsumePartitions
	// in ExtraOpts, ShareGroup with either).
	ErrUnsupportedOption = errors.New("idemkafka: unsupported kgo option")
)

// optionsError wraps an error of kgo.NewClient; kgo's own refusal of acks
// below all with idempotence on counts as ErrNotIdempotent.
func optionsError(what string, err error) error {
	if strings.Contains(err.Error(), "acks") { // "idempotency requires acks=all"
		return fmt.Errorf("%w: %s: %w", ErrNotIdempotent, what, err)
	}
	return fmt.Errorf("idemkafka: %s: %w", what, err)
}

// optionsView returns a client made from opts that never ran, to read
// the options with OptValue, or kgo.NewClient's error. kgo calls a
// kgo.HookNewClient "before any client goroutines are started" (its
// documented contract), before the client consumes, and the hook, first in
// line, ends NewClient there by panicking: no I/O, no goroutine, no hook of
// the caller's called, nothing to close. A client created with opts would
// start consuming at once (join its ConsumerGroup, fetch its
// ConsumeTopics), before an option could be checked and refused. The
// view's context is not the caller's (kgo.WithContext), whose child it
// would otherwise stay.
func optionsView(opts []kgo.Opt) (view *kgo.Client, err error) {
	h := &viewHook{}
	defer func() {
		if h.cl != nil {
			if p := recover(); p != h {
				panic(p)
			}
			view, err = h.cl, nil
		}
	}()
	opts = append(append([]kgo.Opt{kgo.WithHooks(h)}, opts...), kgo.WithContext(context.Background()))
	if _, err := kgo.NewClient(opts...); err != nil {
		return nil, err
	}
	// Cannot happen: kgo calls the hook of every client it makes.
	panic("idemkafka: kgo.NewClient did not call its HookNewClient")
}

// viewHook ends the kgo.NewClient of optionsView.
type viewHook struct{ cl *kgo.Client }

func (h *viewHook) OnNewClient(cl *kgo.Client) {
	h.cl = cl
	panic(h)
}

// refusedOptions returns the options among ConsumePartitions and
// ShareGroup for which kgo refused opts, nil if there are none or if opts
// are refused for something else too. kgo refuses direct partitions
// (kgo.ConsumePartitions) and a share group (kgo.ShareGroup, KIP-932) in a
// consumer group, and partitions in a share group, with errors of its own,
// before OptValue could tell. An option was a cause if opts validate once
// both are cleared, and not while it is left (clearing changes nothing if
// it was not given); if each is valid alone, their pair was. The options that apply only with a share group
// (ShareMaxRecords, ShareAckCallback) are cleared with it, except
// ShareMaxRecordsStrict, which no option clears: with it, kgo's own error
// stands. It builds no client (no I/O) and runs only after kgo.NewClient
// failed.
func refusedOptions(opts []kgo.Opt) []string {
	partitions := []kgo.Opt{kgo.ConsumePartitions(nil)}
	shareOnly := []kgo.Opt{kgo.ShareMaxRecords(-1), kgo.ShareAckCallback(nil)} // kgo's defaults
	share := append(slices.Clip(shareOnly), kgo.ShareGroup(""))
	valid := func(clear ...[]kgo.Opt) bool {
		return kgo.ValidateOpts(append(slices.Clip(opts), slices.Concat(clear...)...)...) == nil
	}
	if !valid(partitions, share) {
		return nil
	}
	var names []string
	if !valid(share) {
		names = append(names, "ConsumePartitions")
	}
	if !valid(partitions, shareOnly) {
		names = append(names, "ShareGroup")
	}
	if names == nil { // each is valid alone: partitions in a share group
		names = []string{"ConsumePartitions", "ShareGroup"}
	}
	return names
}

// refusedProducerOption returns the error for kgo's refusal of opts when
// it is DefaultProduceTopicAlways without a DefaultProduceTopic (kgo's own
// error, "invalid empty DefaultProduceTopic"), which idemkafka refuses in
// any case: every record must go to the topic it names. It returns nil
// otherwise. No client, no I/O; only after kgo refused opts.
func refusedProducerOption(opts []kgo.Opt) error {
	if kgo.ValidateOpts(append(slices.Clip(opts), kgo.DefaultProduceTopic("idem"))...) == nil {
		return fmt.Errorf("%w: DefaultProduceTopicAlways (every record must go to the topic it names)", ErrUnsupportedOption)
	}
	return nil
}

// checkProducer reports whether cl produces idempotently with acks=all,
// without transactions, each record to its own topic and without waiting
// for a Flush.
func checkProducer(cl *kgo.Client) error {
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return fmt.Errorf("%w: DisableIdempotentWrite is set", ErrNotIdempotent)
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); !ok || acks != kgo.AllISRAcks() {
		return fmt.Errorf("%w: RequiredAcks is not AllISRAcks", ErrNotIdempotent)
	}
	if on, _ := cl.OptValue(kgo.AllowIdempotentProduceCancellation).(bool); on {
		return fmt.Errorf("%w: AllowIdempotentProduceCancellation is set (a cancelled produce may be sent again as a new record)", ErrNotIdempotent)
	}
	if vs := cl.OptValues(kgo.TransactionalID); len(vs) == 2 {
		if set, _ := vs[1].(bool); set {
			return fmt.Errorf("%w: TransactionalID", ErrUnsupportedOption)
		}
	}
	// Every record goes to the topic it names: DefaultProduceTopicAlways
	// would send every dead letter (or event) to one topic, the consumed
	// one included.
	if on, _ := cl.OptValue(kgo.DefaultProduceTopicAlways).(bool); on {
		return fmt.Errorf("%w: DefaultProduceTopicAlways (every record must go to the topic it names)", ErrUnsupportedOption)
	}
	// Records are sent as soon as they are produced: with ManualFlushing a
	// dead letter would wait in the client's buffer, never acknowledged.
	if on, _ := cl.OptValue(kgo.ManualFlushing).(bool); on {
		return fmt.Errorf("%w: ManualFlushing (records must be sent without a Flush)", ErrUnsupportedOption)
	}
	return nil
}
