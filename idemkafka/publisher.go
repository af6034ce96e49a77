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

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/outbox"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Seeds are the seed brokers, host:port (no spaces, port 1 to 65535).
	// Required unless Client is set.
	Seeds []string

	// DefaultTopic is the topic of every event when Topic is nil, or when
	// Topic returns "". The topics must exist: NewPublisher does not check
	// them (CheckTopics does, at start-up: give it Publisher.Client()),
	// and an event for a topic the cluster does not have fails to
	// publish (UNKNOWN_TOPIC_OR_PARTITION, logged by the relay with the
	// topic's name and the fix) and is retried until the topic is created.
	// Publish asks the cluster's metadata whether it has a topic at its
	// first event for it, then again only after a record of it failed as
	// a missing topic's; while a topic is missing, its events fail at once,
	// without a record, and it is asked about at most every 5 s: the other
	// topics' events are not held. A cluster that creates topics on
	// demand (auto.create.topics.enable, kfake.AllowAutoTopicCreation) does
	// so only for a client that asks: add kgo.AllowAutoTopicCreation() to
	// ExtraOpts.
	DefaultTopic string
	// Topic, if set, picks each event's topic. Defaults to nil: every
	// event goes to DefaultTopic. One of the two is required. An event
	// whose topic is a name Kafka refuses (see CheckTopic) is poison. A
	// key's events may go to several topics: they are still published in
	// order (see Publisher.Publish), but each change of topic within a key
	// costs a relay round.
	Topic func(e event.Envelope) string

	// ExtraOpts are more kgo options for the publisher's client (TLS,
	// SASL, compression, linger, ...). The client reads the cluster's
	// metadata every DefaultMetadataMaxAge (10 s; kgo.MetadataMaxAge here
	// changes it), so it uses partitions added to a topic within that
	// time. The client is idempotent with
	// acks=all (franz-go's defaults); NewPublisher rejects options that
	// change that (DisableIdempotentWrite, RequiredAcks other than
	// AllISRAcks, AllowIdempotentProduceCancellation) with
	// ErrNotIdempotent, and TransactionalID, DefaultProduceTopicAlways
	// (every event would go to one topic, whatever Topic picks; with or
	// without a DefaultProduceTopic) and
	// ManualFlushing (a Publish would wait for a Flush that never comes)
	// and a RecordPartitioner that does not keep a key in one partition
	// (RoundRobinPartitioner, StickyPartitioner, LeastBackupPartitioner,
	// UniformBytesPartitioner without keys: a key's events would overtake
	// each other) and consumer options with ErrUnsupportedOption:
	// ConsumeTopics (the client would fetch records for nothing; with a
	// ConsumerGroup it would join the consumers' group and hold partitions
	// it never polls, with a ShareGroup take records it never
	// acknowledges) and ConsumePartitions (it would fetch those partitions'
	// records for nothing; kgo itself refuses them with a ConsumerGroup or
	// a ShareGroup). A ConsumerGroup or ShareGroup without either consumes
	// nothing and is accepted.
	//
	// Produce hooks (kgo.WithHooks) are welcome, franz-go's kotel tracer
	// among them: when the client has one, each record's Context has the
	// trace context stored with its event (the span that enqueued it, read
	// with observe's default Propagator, see idemotel.Install) as its
	// remote parent, so kotel's publish span, and the traceparent it
	// writes over the record's, continue the request's trace, not the
	// relay's. The same holds for a Client with such hooks.
	//
	// A logger (kgo.WithLogger) gets the client's lines at its own level.
	// While records wait unacknowledged (see Publish), the publisher asks
	// kgo for its debug lines too, to read the brokers' error answers from
	// them, and passes on only those the logger's level asks for.
	ExtraOpts []kgo.Opt

	// Client, if set, is used instead of a client of the publisher's own
	// (Seeds and ExtraOpts must then be empty). It is checked like
	// ExtraOpts (except that it may consume: polling it is yours), and
	// Close does not close it. Records produced through it
	// elsewhere share record batches with the publisher's: when the broker
	// refuses such a batch as a whole, the publisher cannot tell their
	// fault from its events', and may park an event for a record of yours
	// (see Publisher.Publish). Publish waits for every record of such a
	// client, as if StragglerTimeout were negative: it learns of each
	// record's outcome through a hook of its own client.
	Client *kgo.Client

	// Logger receives errors the caller cannot see in Publish's result
	// (an order violation within a key). Defaults to slog.Default().
	Logger *slog.Logger

	// HeaderFormat selects the record headers (see RecordWith):
	// event.HeaderFormatIdem (the zero value) writes idem's own headers;
	// event.HeaderFormatCloudEvents writes the CloudEvents Kafka binding's
	// binary-mode headers instead, for consumers that speak CloudEvents;
	// event.HeaderFormatBoth writes both sets (to migrate a topic whose
	// consumers are not all upgraded). Consumers of this package read every
	// format without a setting. With a CloudEvents format, an event with an
	// extra header whose name starts with "ce_" cannot be published (the
	// error wraps outbox.ErrPoison and event.ErrReservedHeader).
	HeaderFormat event.HeaderFormat
	// Source is the CloudEvents source attribute (the ce_source header):
	// a URI-reference naming this producer, such as "/idem" or
	// "https://orders.example.com". Required when HeaderFormat writes
	// CloudEvents headers, ignored otherwise.
	Source string

	// StragglerTimeout bounds how long Publish waits for records that the
	// broker does not acknowledge while it acknowledges the call's others
	// (a partition whose leader does not answer): once no record of the
	// call has been acknowledged for that long (counted from the call's
	// last acknowledgement, or from the end of ctx), Publish returns and
	// reports the records still waiting as failed with ErrOutcomeUnknown.
	// A call none of whose records is acknowledged counts from its start
	// once the broker acknowledged another call's record since, or while
	// a fault is known (records given up within the last minute): its
	// records all went to a partition or topic that takes none (a leader
	// that does not answer, NOT_ENOUGH_REPLICAS) while the others flow;
	// otherwise (a slow or idle cluster) it waits for the end of ctx.
	// Without it, one stuck partition held every relay round that had an
	// event for it, which is nearly all of them (a relay's lanes mix the
	// keys of every partition). While such records wait in the client, the
	// wait is shortened to as long as the call's acknowledged records took
	// (at least 50ms, at most StragglerTimeout), and the events of their
	// keys are not produced again (see Publish). A healthy but slow
	// partition taken for a stuck one costs a relay round for its events
	// (their outcomes reach the relay as the broker tells them, see
	// PublishLate), not an event. Defaults to DefaultStragglerTimeout;
	// a negative value waits for every record, whatever ctx says (the
	// behaviour before it existed), and so does a publisher given a Client
	// (see Client).
	StragglerTimeout time.Duration
}

// DefaultStragglerTimeout is the default PublisherConfig.StragglerTimeout.
const DefaultStragglerTimeout = 2 * time.Second

// writtenTTL is how long the publisher remembers an event written after it
// stopped waiting for its record (see Publisher.written): the relay marks
// it published within milliseconds of learning it.
const writtenTTL = time.Minute

// faultMemory is how long after a Publish stopped waiting for records
// (ErrOutcomeUnknown) the straggler wait of a later Publish also starts
// with the call, not only with its first acknowledgement, and is shortened
// as while such records wait.
const faultMemory = time.Minute

// minStragglerWait is the shortest wait for a straggler while records of
// earlier calls wait unacknowledged in the client.
const minStragglerWait = 50 * time.Millisecond

// ErrOutcomeUnknown is wrapped by the error of an event whose record the
// broker has not acknowledged within PublisherConfig.StragglerTimeout (its
// partition's leader does not answer): the record stays in the client,
// which keeps retrying it, and may still be written. When the client learns
// the record's outcome, PublishLate reports it (the relay then marks the
// event published, or retries it at once); without that, the relay
// publishes the event again after its backoff (same event ID: consumers
// drop the copy). It is also wrapped by the error of a later event of the same key
// while such a record waits: the key is not produced again until the
// broker told the outcome, so that its records never pile up in the client
// and never overtake one another.
var ErrOutcomeUnknown = errors.New("idemkafka: not acknowledged in time; outcome unknown (the record may still be written, and is published again with the same event ID)")

// Publisher publishes outbox events to Kafka with an idempotent producer
// and acks=all. It implements outbox.Publisher. It is safe for concurrent
// use.
type Publisher struct {
	cl    atomic.Pointer[kgo.Client]
	owned bool
	// newClient makes a client like the first one (nil when the client is
	// the caller's): kgo never retries a producer ID it failed for good.
	newClient func() (*kgo.Client, error)
	clMu      sync.Mutex // Close against a renewal of the client
	closed    bool
	// renewals counts the renewals of the client not logged since
	// renewLogged (guarded by clMu).
	renewals    int
	renewLogged time.Time
	topic       func(event.Envelope) string
	maxBytes    func(topic string) int32
	// maxBuffered is the client's MaxBufferedBytes (0: none).
	maxBuffered int64
	log         *slog.Logger
	headers     event.HeaderOptions
	// gate keeps the records of other Publish calls out of the client
	// while produceAlone finds which events of a refused batch are poison.
	gate gate
	// produceHooks: the client has a produce hook (kgo.WithHooks), which
	// may trace the record from its Context (see traceRecord).
	produceHooks bool

	// straggler is PublisherConfig.StragglerTimeout with its default (<0:
	// wait for every record).
	straggler time.Duration
	// waiting counts the records that Publish calls stopped waiting for
	// (ErrOutcomeUnknown) and the client still holds; waitingKeys counts
	// them by key. Guarded by waitMu, waiting also read without it.
	waitMu      sync.Mutex
	waiting     atomic.Int64
	waitingKeys map[string]int
	// waitCap is half of the client's MaxBufferedRecords: with that many
	// records waiting, Publish produces nothing more.
	waitCap int64
	// abandonedAt is when a produce last stopped waiting for records
	// (UnixNano; 0: never): see faultMemory. ackedAt is when the broker
	// last acknowledged a record a produce waited for.
	abandonedAt atomic.Int64
	ackedAt     atomic.Int64
	// written holds the events whose records the broker acknowledged
	// after Publish stopped waiting for them (guarded by waitMu, its size
	// in writtenN): handed over again before the relay marked them (it
	// learns it through PublishLate), they are reported published without
	// a record, not written twice. Entries are forgotten when used, or
	// after writtenTTL.
	written     map[uuid.UUID]time.Time
	writtenN    atomic.Int64
	writtenPrun time.Time

	// known holds the topics the cluster's metadata listed (see
	// checkTopic), guarded by knownMu. autoCreate: the client asks the
	// brokers to create the topics it produces to
	// (kgo.AllowAutoTopicCreation), so none is checked.
	knownMu    sync.RWMutex
	known      map[string]bool
	autoCreate bool

	// diag caches what the cluster's metadata said of the topics whose
	// records were not acknowledged in time (see explain).
	diag diagnoses
	// answers holds the brokers' last error answers to the partitions
	// (see answerLogger), read while listening: suspects counts the
	// produce calls that wait longer than usual (see suspect); forcedAt
	// is when suspect last asked for a metadata update (UnixNano).
	answers  answers
	suspects atomic.Int32
	forcedAt atomic.Int64

	// calls maps the records of the produce calls in flight to their
	// call (*produceCall), for outcomeHook.
	calls sync.Map
}

// outcomeHook tells the publisher the outcome of each record of its own
// client, just before kgo calls the record's promise.
type outcomeHook struct{ p *Publisher }

var _ kgo.HookProduceRecordUnbuffered = outcomeHook{}

func (h outcomeHook) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if v, ok := h.p.calls.LoadAndDelete(r); ok {
		v.(*produceCall).done(h.p, r, err)
	}
}

var _ outbox.LatePublisher = (*Publisher)(nil)

// recordOverhead is the room left in a record batch for the batch header
// and the record's own framing when checking an event's size up front;
// with many headers, 128 bytes (the batch header and the record's fields)
// plus headerOverhead for each header (two varint lengths) if more.
const (
	recordOverhead = 1024
	headerOverhead = 10
)

// NewPublisher returns a publisher. It checks the options (or
// cfg.Client), then creates its client, which does not connect until the
// first Publish: options it refuses create no client. cfg is required
// (Seeds or Client, and a topic).
func NewPublisher(cfg *PublisherConfig) (*Publisher, error) {
	if cfg == nil {
		return nil, errors.New("idemkafka: nil PublisherConfig: Seeds (or Client) and DefaultTopic (or Topic) are required")
	}
	p := &Publisher{topic: cfg.Topic, log: cfg.Logger, headers: event.HeaderOptions{Format: cfg.HeaderFormat, Source: cfg.Source},
		straggler: cfg.StragglerTimeout, waitingKeys: map[string]int{}}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.straggler == 0 {
		p.straggler = DefaultStragglerTimeout
	}
	switch {
	case cfg.Topic == nil && cfg.DefaultTopic == "":
		return nil, errors.New("idemkafka: invalid PublisherConfig: DefaultTopic or Topic is required")
	case cfg.Client != nil && (len(cfg.Seeds) > 0 || len(cfg.ExtraOpts) > 0):
		return nil, errors.New("idemkafka: invalid PublisherConfig: Seeds and ExtraOpts must be empty when Client is set")
	case cfg.Client == nil && len(cfg.Seeds) == 0:
		return nil, errors.New("idemkafka: invalid PublisherConfig: no Seeds: at least one seed broker is required")
	}
	for _, s := range cfg.Seeds {
		if err := checkSeed(s); err != nil {
			return nil, fmt.Errorf("idemkafka: invalid PublisherConfig: %w", err)
		}
	}
	if cfg.DefaultTopic != "" {
		if err := CheckTopic(cfg.DefaultTopic); err != nil {
			return nil, fmt.Errorf("idemkafka: invalid PublisherConfig: DefaultTopic: %w", err)
		}
	}
	if err := p.headers.Validate(); err != nil {
		return nil, fmt.Errorf("idemkafka: invalid PublisherConfig: HeaderFormat and Source: %w", err)
	}
	// The options are checked before the publisher's own client exists:
	// created with consumer options, it would consume at once (see
	// optionsView).
	var opts []kgo.Opt
	cl := cfg.Client
	if cl == nil {
		opts = append([]kgo.Opt{
			kgo.SeedBrokers(cfg.Seeds...),
			kgo.RequiredAcks(kgo.AllISRAcks()),
		}, cfg.ExtraOpts...)
		view, err := optionsView(opts)
		if err != nil {
			if names := refusedOptions(opts); len(names) > 0 { // with a ConsumerGroup or a ShareGroup
				return nil, fmt.Errorf("%w: %s (the publisher's client would consume)", ErrUnsupportedOption, strings.Join(names, " and "))
			}
			if err := refusedProducerOption(opts); err != nil {
				return nil, err
			}
			return nil, optionsError("publisher client", err)
		}
		if err := checkNotConsuming(view); err != nil {
			return nil, err
		}
		cl = view
		opts = append([]kgo.Opt{metadataMaxAge(view)}, opts...) // ExtraOpts may set another
	}
	if err := checkProducer(cl); err != nil {
		return nil, err
	}
	if err := checkKeyed(cl); err != nil {
		return nil, err
	}
	p.produceHooks = hasProduceHook(cl)
	p.autoCreate, _ = cl.OptValue(kgo.AllowAutoTopicCreation).(bool)
	p.maxBytes, _ = cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(topic string) int32)
	p.maxBuffered, _ = cl.OptValue(kgo.MaxBufferedBytes).(int64)
	if n, _ := cl.OptValue(kgo.MaxBufferedRecords).(int64); n > 0 {
		p.waitCap = max(n/2, 1)
	}
	if cfg.Client != nil {
		p.cl.Store(cfg.Client)
	} else {
		// The hook tells produce each record's outcome as it comes,
		// while ProduceSync unlingers the records' partitions. The
		// logger reads the brokers' error answers while records wait
		// (see answerLogger), and passes the rest on to ExtraOpts'.
		inner, _ := cl.OptValue(kgo.WithLogger).(kgo.Logger) // cl is the view of opts
		opts = append(opts, kgo.WithHooks(outcomeHook{p}), kgo.WithLogger(answerLogger{inner: inner, p: p}))
		own, err := kgo.NewClient(opts...)
		if err != nil { // cannot happen: the view was made from opts
			return nil, optionsError("publisher client", err)
		}
		p.cl.Store(own)
		p.owned = true
		p.newClient = func() (*kgo.Client, error) { return kgo.NewClient(opts...) }
	}
	if p.topic == nil {
		p.topic = func(event.Envelope) string { return cfg.DefaultTopic }
	} else if cfg.DefaultTopic != "" {
		pick := cfg.Topic
		p.topic = func(e event.Envelope) string {
			if t := pick(e); t != "" {
				return t
			}
			return cfg.DefaultTopic
		}
	}
	return p, nil
}

// Client returns the publisher's client. A client of the publisher's own
// is replaced, and closed, when kgo fails its producer ID for good (see
// Publish): call Client again rather than keep the result.
func (p *Publisher) Client() *kgo.Client { return p.cl.Load() }

// Close closes the client, unless it was given in PublisherConfig.Client. A
// Publish blocked on a record whose outcome the broker has not told yet
// (see Publish) returns then.
func (p *Publisher) Close() {
	p.clMu.Lock()
	p.closed = true
	p.clMu.Unlock()
	if p.owned {
		p.cl.Load().Close()
	}
}

// Publish produces events as records (see RecordWith, with the
// configured HeaderFormat and Source) and waits until the
// broker acknowledged each of them with acks=all. It returns nil when all
// are published, and otherwise an *outbox.PublishError with one entry per
// event: nil for a published event, the cause for the others. Events that
// can never be published (invalid envelope, a topic name Kafka refuses,
// record too large, rejected by the broker as invalid) wrap outbox.ErrPoison (what an operator fixes is
// not poison but retried until fixed: a topic the producer may not write
// to, a timestamp out of the topic's range, a broker policy); an event of a
// key whose earlier event failed before being sent wraps outbox.ErrSkipped
// and is not sent.
//
// When the broker refuses a record batch as a whole (MESSAGE_TOO_LARGE on
// a topic whose max.message.bytes is below the client's batch size,
// INVALID_RECORD, CORRUPT_MESSAGE), kgo fails every record of it, which may
// hold the records of several events, and of concurrent Publish calls.
// Those events are then produced again one record at a time, while the
// publisher's other Publish calls wait, and only an event the broker
// refuses alone is poison.
//
// Order: the events of one key go to one partition of their topic (the key
// is hashed as Java clients do) in the order given, and the idempotent
// producer keeps that order through its retries. When Topic sends a key's
// events to several topics, the order of the key holds across them too:
// from the first event of a key whose topic differs from its previous
// event's, the key's events are not sent in this call (outbox.ErrSkipped;
// the relay hands them over again at its next round, once the earlier ones
// are published), at the cost of a round per change of topic. A broker retry (a timeout after the
// broker appended the batch, a leader change) is deduplicated by the
// broker with the producer's sequence numbers, so it never writes a record
// twice.
//
// kgo fails its client's producer ID for good when the broker refuses
// InitProducerID with an error it does not retry (CLUSTER_AUTHORIZATION_FAILED
// while an ACL is missing, UNKNOWN_SERVER_ERROR), or on a lost sequence with
// kgo.StopProducerOnDataLossDetected: every later record fails at once. After
// a Publish that failed so, a publisher with a client of its own replaces
// it with a new one (a new producer ID), so that publishing resumes once
// the broker accepts the producer; with PublisherConfig.Client it logs an
// error instead, as it cannot replace the caller's client. Likewise, kgo
// keeps the ID of a topic that was deleted and fails its records with
// UNKNOWN_TOPIC_ID even once it is created again: after such a failure the
// publisher purges the topic from the client, and the next Publish looks it
// up afresh.
//
// A partition that does not answer (its leader hung, or cut off) does not
// hold the others: once no record of the call has been acknowledged for
// PublisherConfig.StragglerTimeout (2s by default, counted from the call's
// last acknowledgement, or from the end of ctx; see StragglerTimeout for a
// call without any), Publish returns with the
// events acknowledged so far published and the others failed with
// ErrOutcomeUnknown. When the broker answered their partitions with an
// error that kgo retries (NOT_ENOUGH_REPLICAS, NOT_LEADER_OR_FOLLOWER,
// REQUEST_TIMED_OUT), the error also names and wraps the broker's last
// such answer to the topic (a *kerr.Error: errors.Is(err,
// kerr.NotEnoughReplicas)), with its partitions and age: kgo tells it to
// no hook and no result, so the publisher reads it from kgo's debug log
// lines, which it asks for only while a call waits for records longer
// than usual (half the straggler wait, or the end of ctx) or records it
// gave up waiting for are in the client, and then asks for a metadata
// update so that kgo retries such a partition, and the answer is read,
// within the wait (kgo retries it at the next update, 5 s apart by
// default). The producer keeps such a record and retries it until
// it learns the outcome, whatever ctx says (a record that reached a broker
// may have been written; giving it up would break the idempotent
// sequence), so it may still be written. Through PublishLate (which the
// relay uses), its outcome is reported once the client learns it: an
// event written after all is marked published (not published again), and
// its key goes on at once; through Publish, the relay publishes it again
// after its backoff, with the same ID, and the consumers' inboxes drop the
// copy. Meanwhile the events of its key fail at once with
// ErrOutcomeUnknown, without a record: a key's records never pile up in
// the client, and never overtake one another (kgo fails every record
// buffered after a failed one in its partition). While such records wait,
// the wait for a straggler is as long as the call's acknowledged records
// took (at least 50ms), and with half of the client's MaxBufferedRecords
// waiting, Publish produces nothing more (every event fails with
// ErrOutcomeUnknown) until the broker tells their outcome: the client's
// buffer, shared by every partition, is never filled by them. Close ends
// every wait. A negative StragglerTimeout, or a PublisherConfig.Client (the
// publisher learns each record's outcome through a hook of its own
// client), waits for every record, whatever ctx says, as Publish did
// before StragglerTimeout existed; a record kgo gives up at the end of ctx
// then fails with ctx's error, without the broker's answer (the client's
// debug lines are not read).
//
// The records of the publisher's own client never end with ctx: a record
// whose context has ended as kgo sends it fails with every record buffered
// behind it in its partition, other calls' included, and kgo goes on with
// a later record of their keys handed over just after, which then reached
// the topic first. Known limit, with a Client or a negative
// StragglerTimeout, whose records carry ctx: if ctx ends while a record
// waits unsent in the client, or while kgo waits for room in a full produce
// buffer (kgo.MaxBufferedRecords, kgo.MaxBufferedBytes), kgo fails it (with
// the records buffered behind it) but may still send a later record of
// its key, or of those records' keys, which then reaches the topic first.
// Keep the buffers well above what the relays keep in flight
// (RelayConfig.Concurrency x BatchSize events; kgo's default of 50,000
// records, kgo.MaxBufferedRecords, is far above the relay's defaults, and
// the records that wait for a partition that does not answer are bounded
// at half of it, see above), and PublishTimeout above the broker's answers.
func (p *Publisher) Publish(ctx context.Context, events []event.Envelope) error {
	return p.PublishLate(ctx, events, nil)
}

// PublishLate is Publish, and implements outbox.LatePublisher: for each
// event it reported failed with ErrOutcomeUnknown because its record was
// not acknowledged in time (not for a later event of its key that failed
// without a record), late, if not nil, is called once the client learns
// the record's outcome: late(i, nil) when the broker acknowledged it
// (acks=all) after all, late(i, err) when it failed. The client keeps
// such a record until the broker tells its outcome, whatever ctx says
// (ctx's end does not give up the records of the publisher's own client:
// kgo would fail every record buffered behind one in its partition, the
// records of other calls included, and a later record of their keys
// produced just after could reach the topic first); a record kgo held
// buffered behind those a leader that does not answer holds is sent once
// the partition answers, and reported so. It is called from the
// client's goroutine, after the event's key is released (the key's next
// event is produced again), in the order of the records of a partition,
// and never when the client is not the publisher's own (Client). The relay
// marks such an event published instead of publishing it again, and lets
// its key go on at once instead of after its backoff. An event whose record
// was written so and that is handed over again within a minute (a relay
// round that claimed it before the relay marked it) is reported published
// without a new record, by Publish too: it is not written twice (nor
// rewritten by a redrive within that minute).
func (p *Publisher) PublishLate(ctx context.Context, events []event.Envelope, late func(i int, err error)) error {
	if len(events) == 0 {
		return nil
	}
	var (
		errs   = make([]error, len(events))
		failed map[string]int // key -> index of its first event that was not sent
		moved  map[string]int // key -> index of its first event sent to another topic
		topics = map[string]string{}
		rs     = make([]*kgo.Record, 0, len(events))
		index  = make(map[*kgo.Record]int, len(events))
	)
	// Keys with a record still unacknowledged in the client (a partition
	// whose leader does not answer) are not produced again until it is.
	var (
		waitingKeys map[string]bool
		written     map[int]bool // events written already (see p.written)
		checked     string       // the topic checkTopic last found
	)
	if p.writtenN.Load() > 0 {
		p.waitMu.Lock()
		for i, e := range events {
			if _, ok := p.written[e.ID]; ok {
				delete(p.written, e.ID)
				if written == nil {
					written = map[int]bool{}
				}
				written[i] = true
			}
		}
		p.writtenN.Store(int64(len(p.written)))
		p.waitMu.Unlock()
	}
	if p.waiting.Load() > 0 {
		p.waitMu.Lock()
		for _, e := range events {
			if p.waitingKeys[e.Key] > 0 {
				if waitingKeys == nil {
					waitingKeys = map[string]bool{}
				}
				waitingKeys[e.Key] = true
			}
		}
		p.waitMu.Unlock()
	}
	for i, e := range events {
		if j, ok := failed[e.Key]; ok {
			errs[i] = fmt.Errorf("%w: event %d of key %q failed", outbox.ErrSkipped, j, e.Key)
			continue
		}
		if written[i] {
			// Acknowledged after its Publish stopped waiting: published,
			// and after the key's earlier events (its partition's order).
			continue
		}
		if waitingKeys[e.Key] {
			errs[i] = fmt.Errorf("idemkafka: produce to %s: an earlier record of the event's key is in the client, not acknowledged yet: %w", p.topic(e), ErrOutcomeUnknown)
			if failed == nil {
				failed = map[string]int{}
			}
			failed[e.Key] = i
			continue
		}
		if j, ok := moved[e.Key]; ok {
			errs[i] = fmt.Errorf("%w: event %d of key %q goes to another topic than the key's earlier events: it waits for them", outbox.ErrSkipped, j, e.Key)
			continue
		}
		r, err := p.record(e)
		if err == nil && r.Topic != checked {
			if err = p.checkTopic(ctx, r.Topic); err == nil {
				checked = r.Topic
			}
		}
		if err != nil {
			errs[i] = err
			if failed == nil {
				failed = map[string]int{}
			}
			failed[e.Key] = i
			continue
		}
		// Records of one key in two topics are produced at once, in two
		// partitions: the later one could be acknowledged though the
		// earlier one fails. The key's events from its first change of
		// topic on wait for the next batch.
		if t, ok := topics[e.Key]; ok && t != r.Topic {
			errs[i] = fmt.Errorf("%w: event %d of key %q goes to another topic than the key's earlier events: it waits for them", outbox.ErrSkipped, i, e.Key)
			if moved == nil {
				moved = map[string]int{}
			}
			moved[e.Key] = i
			continue
		}
		topics[e.Key] = r.Topic
		p.traceRecord(p.recordContext(ctx), r, e)
		rs = append(rs, r)
		index[r] = i
	}
	var (
		alone []int // events whose batch the broker refused as a whole
		cl    *kgo.Client
		gone  []string // topics the broker no longer knows by their ID
	)
	if len(rs) > 0 {
		results := make(kgo.ProduceResults, 0, len(rs))
		if err := p.gate.enter(ctx, false); err != nil {
			for _, r := range rs {
				results = append(results, kgo.ProduceResult{Record: r, Err: err})
			}
		} else {
			cl = p.cl.Load()
			results = p.produce(ctx, cl, rs, index, events, errs, late)
			p.gate.leave(false)
		}
		for _, res := range results {
			if res.Record == nil { // not acknowledged in time: errs has it
				continue
			}
			i := index[res.Record]
			if errors.Is(res.Err, kerr.UnknownTopicID) && !slices.Contains(gone, res.Record.Topic) {
				gone = append(gone, res.Record.Topic)
			}
			if errors.Is(res.Err, kerr.UnknownTopicID) || errors.Is(res.Err, kerr.UnknownTopicOrPartition) {
				p.forgetKnown(res.Record.Topic)
			}
			if res.Err != nil {
				// Even a batch of one: another Publish call's records
				// may have shared its record batch.
				if batchLevel(res.Err) {
					alone = append(alone, i)
					continue
				}
				errs[i] = classify(res.Record.Topic, res.Err)
				continue
			}
			if res.Record.ProducerID < 0 { // cannot happen: checked at construction
				p.log.Error("idemkafka: record was produced without idempotence", "event_id", events[i].ID, "topic", res.Record.Topic)
			}
		}
	}
	if len(alone) > 0 {
		p.produceAlone(ctx, events, alone, errs)
	}
	p.explain(ctx, p.cl.Load(), events, errs)
	err := p.outcome(events, errs)
	if err != nil && cl != nil && !p.renewIfFailed(ctx, cl) && len(gone) > 0 {
		p.forgetTopics(ctx, cl, gone)
	}
	return err
}

// produceCall is what the outcomes of one produce's records tell it.
type produceCall struct {
	mu        sync.Mutex
	results   kgo.ProduceResults
	total     int                      // records produced
	key       func(*kgo.Record) string // a record's event key
	index     map[*kgo.Record]int      // a record's event
	events    []event.Envelope         // the call's events
	late      func(i int, err error)   // PublishLate's, or nil
	last      time.Time                // when the last result came
	abandoned bool                     // produce returned: the outcomes release the keys instead
	wake      chan struct{}
}

// done records the outcome of r, one of c's records.
func (c *produceCall) done(p *Publisher, r *kgo.Record, err error) {
	c.mu.Lock()
	if c.abandoned {
		c.mu.Unlock()
		if err == nil {
			p.rememberWritten(c.events[c.index[r]].ID)
			// Its partition writes again: kgo's line that says so may
			// come once the answers are no longer read.
			p.answers.forget(r.Topic, r.Partition)
		}
		p.unwait(c.key(r))
		// The record's context never ends (see recordContext): kgo gives
		// up no record unsent, and err is the broker's, or the client's
		// (closed).
		if c.late != nil {
			if err != nil {
				err = fmt.Errorf("idemkafka: a record not acknowledged in time failed after all: %w", classify(r.Topic, err))
			}
			c.late(c.index[r], err)
		}
		return
	}
	c.results = append(c.results, kgo.ProduceResult{Record: r, Err: err})
	c.last = time.Now()
	if err == nil {
		p.ackedAt.Store(c.last.UnixNano())
	}
	n := len(c.results)
	c.mu.Unlock()
	// The waiter needs the first result (to start the straggler wait)
	// and the last; the others it reads when its wait ends.
	if n == 1 || n == c.total {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// produce produces rs (the records of events, index giving each record's
// event) and returns their results, as ProduceSync does, except for the
// records the broker does not acknowledge while it acknowledges the
// others: once no result has come for the straggler wait (see
// PublisherConfig.StragglerTimeout), counted from the last result or from
// the end of ctx, produce returns without them, their events' errs wrap
// ErrOutcomeUnknown, and their keys are held (p.waitingKeys) until the
// client tells their outcome. kgo keeps such a record (it has reached a
// broker, which may have written it: failing it would break the idempotent
// sequence) and fails the records buffered after it in its partition if
// it fails, so a key's records never overtake each other in the topic.
// The outcomes come from outcomeHook, on the publisher's own client only:
// with PublisherConfig.Client, produce waits for every record.
func (p *Publisher) produce(ctx context.Context, cl *kgo.Client, rs []*kgo.Record, index map[*kgo.Record]int, events []event.Envelope, errs []error, late func(int, error)) kgo.ProduceResults {
	if p.straggler < 0 || !p.owned {
		return cl.ProduceSync(ctx, rs...)
	}
	if p.waitCap > 0 && p.waiting.Load() >= p.waitCap {
		// The client's buffer is shared by every partition: once full
		// (MaxBufferedRecords), Produce would block for all of them.
		for _, r := range rs {
			errs[index[r]] = fmt.Errorf("idemkafka: produce to %s: %d records not acknowledged in time wait in the client (half of its MaxBufferedRecords); nothing more is produced until the broker tells their outcome: %w",
				r.Topic, p.waiting.Load(), ErrOutcomeUnknown)
		}
		return nil
	}
	c := &produceCall{results: make(kgo.ProduceResults, 0, len(rs)), total: len(rs), key: func(r *kgo.Record) string { return events[index[r]].Key },
		index: index, events: events, late: late, wake: make(chan struct{}, 1)}
	for _, r := range rs {
		p.calls.Store(r, c)
	}
	start := time.Now()
	// ProduceSync unlingers the partitions of the records (a Produce
	// would wait for the client's linger); the hook tells their outcomes
	// as they come. The goroutine outlives produce for records it stops
	// waiting for.
	go cl.ProduceSync(p.recordContext(ctx), rs...)
	var (
		done  = ctx.Done()
		ended time.Time // when ctx ended
		// timer is set to the deadline once armed (a result came, or ctx
		// ended), first to half the time left until the call is
		// suspected; before, it looks at the call every straggler wait.
		timer = time.NewTimer(p.straggler)
		armed bool
		// suspected: the call's records wait longer than usual; the
		// brokers' answers are read until it returns (see suspect).
		suspected bool
	)
	defer func() {
		timer.Stop()
		if suspected {
			p.unsuspect()
		}
	}()
	// fault reports whether records were given up within faultMemory, or
	// still wait in the client: a partition or topic is known not to
	// take records.
	fault := func() bool {
		return p.waiting.Load() > 0 || time.Since(time.Unix(0, p.abandonedAt.Load())) < faultMemory
	}
	// deadline is when the straggler wait ends, given the call's n results
	// so far, the last at last (counted from the call's start if none, or
	// from the end of ctx if later).
	deadline := func(n int, last time.Time) time.Time {
		wait := p.straggler
		if n > 0 && fault() {
			// A partition is known not to answer: give the stragglers as
			// long again as the others took.
			wait = min(wait, max(minStragglerWait, last.Sub(start)))
		}
		if n == 0 {
			last = start
		}
		if ended.After(last) {
			last = ended
		}
		return last.Add(wait)
	}
	for {
		c.mu.Lock()
		n, last := len(c.results), c.last
		c.mu.Unlock()
		if n == len(rs) {
			return c.results
		}
		if !armed && n > 0 {
			d := time.Until(deadline(n, last))
			if !suspected {
				d /= 2
			}
			timer.Reset(d)
			armed = true
		}
		select {
		case <-c.wake:
		case <-done:
			done, ended = nil, time.Now()
			if !suspected {
				suspected = true
				p.suspect(cl)
			}
			timer.Reset(time.Until(deadline(n, last)))
			armed = true
		case <-timer.C:
			if !suspected {
				suspected = true
				p.suspect(cl)
			}
			// Results that came since the timer was set (the promises
			// wake this loop for the first and the last only) move the
			// deadline on.
			c.mu.Lock()
			n, last = len(c.results), c.last
			c.mu.Unlock()
			if !armed && n == 0 && p.ackedAt.Load() < start.UnixNano() && !fault() {
				// Nothing acknowledged since the call began, here or in
				// another call, and no fault known: the cluster is slow
				// (or idle), not one of its partitions; wait on for ctx.
				// A call whose records all went to a partition or topic
				// that takes none while the others are written (a leader
				// that does not answer, NOT_ENOUGH_REPLICAS, records that
				// never leave the client) waited for its whole context,
				// 30 s in a relay, holding its round's lanes and the
				// other keys in them.
				timer.Reset(p.straggler)
			} else if d := time.Until(deadline(n, last)); d > 0 {
				timer.Reset(d)
			} else if p.abandon(c, rs, index, events, errs) {
				return c.results
			}
		}
	}
}

// recordContext returns the context of the records a Publish given ctx
// hands to the client: ctx without its end when produce may stop waiting
// for them (the publisher's own client, StragglerTimeout not negative).
// kgo fails every record buffered in a partition, whatever call produced
// it, when it finds the context of the first one ended as it sends it; a
// record of a call that stopped waiting (its context ends as it returns,
// in a relay round) thus failed the records buffered behind it, and a
// later record of their keys that a running call handed to the client
// just after (one Produce per record) reached the topic before them: a
// key's order broke after a partition that did not answer healed
// (TestPublishStuckPartitionGivenUpRecordKeepsOthersOrder). Such records
// stay in the client until the broker tells their outcome, as the ones in
// flight did already, and reach the relay through PublishLate; Close
// fails them.
func (p *Publisher) recordContext(ctx context.Context) context.Context {
	if p.straggler < 0 || !p.owned {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// abandon makes produce stop waiting for the records of c that have no
// result, unless all have one now. It reports whether it did.
func (p *Publisher) abandon(c *produceCall, rs []*kgo.Record, index map[*kgo.Record]int, events []event.Envelope, errs []error) bool {
	p.waitMu.Lock()
	defer p.waitMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.results) == len(rs) {
		return false // the last came as the wait ended
	}
	c.abandoned = true
	p.abandonedAt.Store(time.Now().UnixNano())
	got := make(map[*kgo.Record]bool, len(c.results))
	for _, res := range c.results {
		got[res.Record] = true
	}
	before := p.waiting.Load()
	for _, r := range rs {
		if got[r] {
			continue
		}
		i := index[r]
		errs[i] = fmt.Errorf("idemkafka: produce to %s: %w", r.Topic, ErrOutcomeUnknown)
		p.waitingKeys[events[i].Key]++
		p.waiting.Add(1)
	}
	if before == 0 {
		p.log.Warn("idemkafka: records not acknowledged while the broker acknowledged the others (a partition whose leader does not answer?); their events are retried later and their keys wait for their outcome, the other keys go on",
			"records", p.waiting.Load(), "straggler_timeout", p.straggler)
	}
	return true
}

// rememberWritten remembers that the record of event id, which a produce
// stopped waiting for, was written (see Publisher.written), and forgets
// the entries older than writtenTTL.
func (p *Publisher) rememberWritten(id uuid.UUID) {
	p.waitMu.Lock()
	defer p.waitMu.Unlock()
	now := time.Now()
	if p.written == nil {
		p.written = map[uuid.UUID]time.Time{}
	}
	if now.Sub(p.writtenPrun) > writtenTTL/10 {
		p.writtenPrun = now
		for k, at := range p.written {
			if now.Sub(at) > writtenTTL {
				delete(p.written, k)
			}
		}
	}
	p.written[id] = now
	p.writtenN.Store(int64(len(p.written)))
}

// unwait releases a record of key, which a produce stopped waiting for:
// the client told its outcome.
func (p *Publisher) unwait(key string) {
	p.waitMu.Lock()
	defer p.waitMu.Unlock()
	if p.waitingKeys[key]--; p.waitingKeys[key] <= 0 {
		delete(p.waitingKeys, key)
	}
	if p.waiting.Add(-1) == 0 {
		p.log.Info("idemkafka: every record that was not acknowledged in time has its outcome now")
	}
}

// checkNotConsuming reports whether cl, the publisher's own client,
// consumes: consumer options shared with a consumer's ExtraOpts would make
// it join the consumers' group (kgo joins when the client is created) and
// take partitions it never polls, or fetch records for nothing.
func checkNotConsuming(cl *kgo.Client) error {
	if ts, _ := cl.OptValue(kgo.ConsumeTopics).([]string); len(ts) > 0 {
		return fmt.Errorf("%w: ConsumeTopics (the publisher's client would consume%s)", ErrUnsupportedOption, groupNote(cl))
	}
	if ps, _ := cl.OptValue(kgo.ConsumePartitions).(map[string]map[int32]kgo.Offset); len(ps) > 0 {
		return fmt.Errorf("%w: ConsumePartitions (the publisher's client would consume)", ErrUnsupportedOption)
	}
	return nil
}

func groupNote(cl *kgo.Client) string {
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != "" {
		return fmt.Sprintf(", as a member of group %q, partitions it never polls", g)
	}
	if g, _ := cl.OptValue(kgo.ShareGroup).(string); g != "" {
		return fmt.Sprintf(", as a member of ShareGroup %q, records it never acknowledges", g)
	}
	return ""
}

// checkKeyed reports whether cl's partitioner sends the records of a key
// to one partition: a partitioner that spreads them (RoundRobinPartitioner,
// StickyPartitioner, LeastBackupPartitioner, UniformBytesPartitioner
// without keys) would let a key's later event overtake an earlier one in
// another partition.
func checkKeyed(cl *kgo.Client) error {
	part, ok := cl.OptValue(kgo.RecordPartitioner).(kgo.Partitioner)
	if !ok || part == nil {
		return nil // kgo's default hashes the key
	}
	if !part.ForTopic("idem").RequiresConsistency(&kgo.Record{Topic: "idem", Key: []byte("idem")}) {
		return fmt.Errorf("%w: RecordPartitioner does not keep a key in one partition (the order of a key's events would break)", ErrUnsupportedOption)
	}
	return nil
}

// hasProduceHook reports whether cl has a hook that sees the records it
// buffers, such as the tracer of franz-go's kotel plugin.
func hasProduceHook(cl *kgo.Client) bool {
	hooks, _ := cl.OptValue(kgo.WithHooks).([]kgo.Hook)
	for _, h := range hooks {
		if _, ok := h.(kgo.HookProduceRecordBuffered); ok {
			return true
		}
	}
	return false
}

// traceRecord makes the trace context stored with e (the span that
// enqueued it, see outbox.EnqueueTx) the remote parent in r's Context, read
// with observe's default Propagator, when the client has a produce hook. A
// tracing hook (kotel's) starts its publish span from the record's Context
// and injects that span into the record's traceparent header, over the one
// taken from the outbox row: from ctx alone, the relay's, the consumer
// would continue the relay's batch (a trace of its own when the batch
// mixes traces, or a new trace when the relay traces nothing) instead of
// the request that enqueued the event. r.Context is derived from ctx, so
// ctx still bounds the record as in ProduceSync.
func (p *Publisher) traceRecord(ctx context.Context, r *kgo.Record, e event.Envelope) {
	if !p.produceHooks || e.Headers[observe.TraceParent] == "" {
		return
	}
	prop := observe.DefaultPropagator()
	if prop == nil {
		return
	}
	r.Context = prop.Extract(ctx, func(k string) string { return e.Headers[k] })
}

// checkTopic returns nil when the cluster's metadata lists topic, or
// cannot be read (the client then tells what it finds), and the error of
// an event for topic, not produced, when it does not (UNKNOWN_TOPIC_OR_PARTITION).
// kgo waits for a topic it has no metadata for (UnknownTopicRetries
// loads, MetadataMinAge apart: 20 s by default) before it fails its
// records, so they were taken for records of a partition that does not
// answer: every Publish with one waited the straggler timeout, or its
// whole context when it had no other record, holding the relay's rounds
// and their lanes, the other topics' keys included. A topic is asked about
// at the first Publish to it, then remembered as found until a record of
// it fails as a missing or deleted topic's would; a topic not found is
// asked about again at most every diagnoseTTL (one metadata request),
// its events failing at once meanwhile. Nothing is checked for a client
// that creates topics on demand (kgo.AllowAutoTopicCreation).
func (p *Publisher) checkTopic(ctx context.Context, topic string) error {
	if p.autoCreate {
		return nil
	}
	p.knownMu.RLock()
	ok := p.known[topic]
	p.knownMu.RUnlock()
	if ok {
		return nil
	}
	d := p.diag.notesFor(ctx, p.cl.Load(), []string{topic})[topic]
	switch {
	case d.missing:
		return fmt.Errorf("idemkafka: produce to %s: %w: %w", topic, missingTopic(topic, true), kerr.UnknownTopicOrPartition)
	case d.answered:
		p.knownMu.Lock()
		if p.known == nil {
			p.known = map[string]bool{}
		}
		p.known[topic] = true
		p.knownMu.Unlock()
	}
	return nil
}

// forgetKnown makes the next Publish to topic ask the cluster's metadata
// whether it has it (see checkTopic).
func (p *Publisher) forgetKnown(topic string) {
	p.knownMu.Lock()
	delete(p.known, topic)
	p.knownMu.Unlock()
}

// forgetTopics makes cl forget what it knows of topics, which the broker
// no longer knows by the ID cl has for them (UNKNOWN_TOPIC_ID: deleted, and
// maybe created again). kgo produces by topic ID (produce v13 and later)
// and keeps a deleted topic's ID until the topic is purged from the
// client: every later record to it failed, also once an operator had
// created the topic again. The next Publish loads the topic afresh. The
// other Publish calls wait meanwhile (p.gate): a purge fails the records
// of the topic that are in the client.
func (p *Publisher) forgetTopics(ctx context.Context, cl *kgo.Client, topics []string) {
	if p.gate.enter(ctx, true) != nil {
		return // the next failed Publish tries again
	}
	defer p.gate.leave(true)
	cl.PurgeTopicsFromProducing(topics...)
	p.log.Warn("idemkafka: the broker no longer knows the topic by its ID (deleted, maybe created again); the next publish looks it up again",
		"topics", topics)
}

// renewCheckTimeout bounds renewIfFailed's look at the producer ID.
const renewCheckTimeout = 5 * time.Second

// renewIfFailed replaces cl, the client a failed Publish produced with, if
// kgo failed its producer ID for good: an InitProducerID the broker refused
// with an error kgo does not retry (CLUSTER_AUTHORIZATION_FAILED while an
// ACL is missing, UNKNOWN_SERVER_ERROR), or a loss of the producer's
// sequence with kgo.StopProducerOnDataLossDetected. kgo then fails every
// record at once, for the client's lifetime, and the relay never published
// again, even after the cause was fixed. The new client (new producer ID)
// starts from the events the relay hands over again, in order. A client
// given in PublisherConfig.Client cannot be replaced: it is logged. It
// reports whether the producer ID had failed for good.
func (p *Publisher) renewIfFailed(ctx context.Context, cl *kgo.Client) bool {
	// Instant for a loaded or failed ID; an ID being reloaded (after a lost
	// sequence) is waited for a little, as the next Publish would.
	idCtx, cancel := context.WithTimeout(ctx, renewCheckTimeout)
	_, _, err := cl.ProducerID(idCtx)
	expired := idCtx.Err() != nil
	cancel()
	var ke *kerr.Error
	if err == nil || expired || !errors.As(err, &ke) || ke.Retriable {
		return false // a producer ID, or a failure kgo retries
	}
	if p.newClient == nil {
		p.log.Error("idemkafka: the publisher's client failed its producer ID for good and fails every record; kgo never retries it: give the publisher a new client (restart)",
			"err", err)
		return true
	}
	if p.gate.enter(ctx, true) != nil {
		return true // the next failed Publish tries again
	}
	defer p.gate.leave(true)
	p.clMu.Lock()
	defer p.clMu.Unlock()
	if p.closed || p.cl.Load() != cl {
		return true // closed, or renewed by another Publish
	}
	ncl, nerr := p.newClient()
	if nerr != nil {
		p.log.Error("idemkafka: the publisher's client failed its producer ID for good; no new client", "err", err, "new_client_err", nerr)
		return true
	}
	p.cl.Store(ncl)
	cl.Close()
	// While the cause lasts (an ACL missing), every failed Publish renews
	// the client: its first renewal is logged, the next ones at most every
	// renewLogInterval, with their count.
	p.renewals++
	if now := time.Now(); now.Sub(p.renewLogged) >= renewLogInterval {
		p.log.Warn("idemkafka: the publisher's client failed its producer ID for good; publishing with a new client",
			"err", withACLHint("", err), "renewals", p.renewals)
		p.renewLogged, p.renewals = now, 0
	}
	return true
}

// renewLogInterval is how often the renewals of the publisher's client are
// logged while they repeat.
const renewLogInterval = 30 * time.Second

// withACLHint returns err, a failure to produce to topic, with the
// permission to grant when it is an authorization failure, and err
// otherwise.
func withACLHint(topic string, err error) error {
	switch {
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		return fmt.Errorf("%w (grant the producer's principal IDEMPOTENT_WRITE on the cluster: "+
			"idempotent producers need it on Kafka before 2.8, and WRITE on the topic)", err)
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return fmt.Errorf("%w (grant the producer's principal WRITE and DESCRIBE on topic %q: an ACL; the events wait in the outbox meanwhile)", err, topic)
	}
	return err
}

// batchLevel reports whether a broker's error may concern a whole record
// batch rather than the record (kgo fails every record of a batch the
// broker refuses, and does not split it): a batch over the topic's
// max.message.bytes, or one the broker found invalid.
func batchLevel(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage)
}

// produceAlone produces the events idx (in order) one record at a time,
// after their batch was refused as a whole: only an event refused alone is
// poison, and a key's later events wait behind its failed one (skipped).
// Meanwhile the other Publish calls wait (p.gate): kgo would put their
// records into the same record batch, and fail them with it.
func (p *Publisher) produceAlone(ctx context.Context, events []event.Envelope, idx []int, errs []error) {
	slices.Sort(idx)
	p.log.Warn("idemkafka: the broker refused a batch as a whole; producing its events one at a time",
		"events", len(idx), "first_event_id", events[idx[0]].ID)
	if err := p.gate.enter(ctx, true); err != nil {
		for _, i := range idx {
			errs[i] = fmt.Errorf("idemkafka: the broker refused the batch of event %s as a whole; not produced alone: %w", events[i].ID, err)
		}
		return
	}
	defer p.gate.leave(true)
	var failed map[string]int
	for _, i := range idx {
		e := events[i]
		if j, ok := failed[e.Key]; ok {
			errs[i] = fmt.Errorf("%w: event %d of key %q failed", outbox.ErrSkipped, j, e.Key)
			continue
		}
		r, err := p.record(e)
		if err == nil {
			p.traceRecord(ctx, r, e)
			if err = p.cl.Load().ProduceSync(ctx, r).FirstErr(); err != nil {
				err = classify(r.Topic, err)
			}
		}
		if err != nil {
			errs[i] = err
			if failed == nil {
				failed = map[string]int{}
			}
			failed[e.Key] = i
		}
	}
}

// record returns the record of e, or a poison error if it cannot be
// published.
func (p *Publisher) record(e event.Envelope) (*kgo.Record, error) {
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", outbox.ErrPoison, err)
	}
	topic := p.topic(e)
	if topic == "" {
		return nil, fmt.Errorf("%w: no topic for event %s", outbox.ErrPoison, e.ID)
	}
	// A name Kafka refuses is never written: kgo would retry it against
	// the broker (UNKNOWN_TOPIC_OR_PARTITION), a failure to retry for ever.
	if err := CheckTopic(topic); err != nil {
		return nil, fmt.Errorf("%w: event %s: %w", outbox.ErrPoison, e.ID, err)
	}
	r, err := RecordWith(topic, e, p.headers)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", outbox.ErrPoison, err)
	}
	// kgo fails a record over its own limits at once and alone, and goes
	// on with the key's later records: caught here, before any is sent.
	size := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		size += len(h.Key) + len(h.Value)
	}
	if p.maxBuffered > 0 && int64(size) > p.maxBuffered {
		return nil, fmt.Errorf("%w: %w: event %s is %d bytes; the client buffers up to %d bytes (MaxBufferedBytes)",
			outbox.ErrPoison, kerr.MessageTooLarge, e.ID, size, p.maxBuffered)
	}
	if p.maxBytes != nil {
		overhead := max(recordOverhead, 128+headerOverhead*len(r.Headers))
		if limit := int(p.maxBytes(topic)); size+overhead > limit {
			return nil, fmt.Errorf("%w: %w: event %s is %d bytes with %d headers; it does not fit a batch of %d bytes (ProducerBatchMaxBytes)",
				outbox.ErrPoison, kerr.MessageTooLarge, e.ID, size, len(r.Headers), limit)
		}
	}
	return r, nil
}

// poisonErrs are produce errors that retrying the same record cannot fix
// (INVALID_TOPIC_EXCEPTION: the event's topic name is illegal, whatever an
// operator does). Errors an operator fixes are not among them, as poison
// they parked the head of every key, for good, and the events must flow
// once fixed: TOPIC_AUTHORIZATION_FAILED (an ACL); INVALID_TIMESTAMP (the
// records carry the produce time, so only the relay host's clock or the
// topic's message.timestamp.*.ms settings cause it);
// UNSUPPORTED_FOR_MESSAGE_FORMAT and POLICY_VIOLATION (the topic's or the
// broker's configuration).
var poisonErrs = []error{
	kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord,
	kerr.CorruptMessage, kerr.InvalidTopicException,
}

func classify(topic string, err error) error {
	for _, pe := range poisonErrs {
		if errors.Is(err, pe) {
			return fmt.Errorf("%w: produce to %s: %w", outbox.ErrPoison, topic, err)
		}
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("idemkafka: produce to %s: %w: %w", topic, missingTopic(topic, true), err)
	}
	return fmt.Errorf("idemkafka: produce to %s: %w", topic, withACLHint(topic, err))
}

// missingTopic is the error that says what to do about a topic the broker
// does not have (UNKNOWN_TOPIC_OR_PARTITION): the events for it wait (in
// the outbox, or in their partition for a dead-letter topic) until it
// exists. withDLQ names the topic's dead-letter topic too.
func missingTopic(topic string, withDLQ bool) error {
	also := ""
	if withDLQ {
		also = fmt.Sprintf(" (and its dead-letter topic, %s.dlq by default)", topic)
	}
	return fmt.Errorf("topic %q does not exist: create it%s, or enable auto-creation "+
		"(auto.create.topics.enable on the broker, and kgo.AllowAutoTopicCreation in ExtraOpts)", topic, also)
}

// outcome returns nil if errs are all nil, and a PublishError otherwise. It
// logs an event published after an earlier event of its key failed: the
// broker rejected a batch (a poison record) and accepted a later one, so
// that key's order is broken and an operator must look.
func (p *Publisher) outcome(events []event.Envelope, errs []error) error {
	var stopped map[string]bool
	bad := false
	for i, err := range errs {
		key := events[i].Key
		switch {
		case err != nil:
			bad = true
			if stopped == nil {
				stopped = map[string]bool{}
			}
			stopped[key] = true
		case stopped[key]:
			p.log.Error("idemkafka: event published after an earlier event of its key failed; the key's order is broken",
				"event_id", events[i].ID, "key", key)
		}
	}
	if !bad {
		return nil
	}
	return &outbox.PublishError{Errs: errs}
}
