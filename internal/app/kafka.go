package app

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/idemkafka"
)

// Kafka modes.
const (
	// KafkaEmbedded runs an in-process Kafka broker (franz-go's kfake) on
	// Config.KafkaEmbeddedAddr, its log in Config.EmbeddedKafkaDir. One
	// idemd per database may run it (the lease EmbeddedLock).
	KafkaEmbedded = "embedded"
	// KafkaOff runs no relay and no consumer: orders are stored, their
	// events stay in the outbox, and the summary endpoint answers 503.
	KafkaOff = "off"
	// KafkaBrokers is a real cluster, named by its seed brokers.
	KafkaBrokers = "brokers"
)

// Kafka says which Kafka idemd uses.
type Kafka struct {
	// Mode is KafkaEmbedded, KafkaOff or KafkaBrokers.
	Mode string
	// Brokers are the seed brokers, host:port separated by commas
	// (KafkaBrokers).
	Brokers string
}

// Seeds returns the seed brokers.
func (k Kafka) Seeds() []string { return strings.Split(k.Brokers, ",") }

// String describes the Kafka setting as -kafka accepts it.
func (k Kafka) String() string {
	if k.Mode == KafkaBrokers {
		return k.Brokers
	}
	return k.Mode
}

var brokerRe = regexp.MustCompile(`^(\[[0-9a-fA-F:.]+\]|[a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?):([0-9]{1,5})$`)

// ParseKafka reads the -kafka setting: embedded, off, or a comma separated
// list of seed brokers host:port.
func ParseKafka(s string) (Kafka, error) {
	switch v := strings.TrimSpace(s); v {
	case "":
		return Kafka{}, fmt.Errorf("no Kafka given: want embedded, off or host:port[,host:port...]")
	case KafkaEmbedded, KafkaOff:
		return Kafka{Mode: v}, nil
	}
	var seeds []string
	for _, b := range strings.Split(s, ",") {
		b = strings.TrimSpace(b)
		m := brokerRe.FindStringSubmatch(b)
		var port int
		if m != nil {
			_, _ = fmt.Sscan(m[3], &port)
		}
		if m == nil || port < 1 || port > 65535 {
			if strings.Contains(s, "@") {
				// USER:PASSWORD@HOST:PORT, as in some clients' URLs: not
				// quoted back.
				return Kafka{}, fmt.Errorf("bad Kafka broker %q in %q: want embedded, off or host:port[,host:port...] like kafka-1:9092; "+
					"credentials are not read from it: give -kafka-sasl, -kafka-sasl-user and %s or -kafka-sasl-password-file",
					hideUserInfo(b), hideUserInfo(s), EnvKafkaSASLPassword)
			}
			return Kafka{}, fmt.Errorf("bad Kafka broker %q in %q: want embedded, off or host:port[,host:port...] like kafka-1:9092", b, s)
		}
		seeds = append(seeds, b)
	}
	return Kafka{Mode: KafkaBrokers, Brokers: strings.Join(seeds, ",")}, nil
}

// hideUserInfo is a -kafka value with what precedes each broker's '@' (a
// user and password) hidden.
func hideUserInfo(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		if at := strings.LastIndexByte(p, '@'); at >= 0 {
			parts[i] = "(hidden)" + p[at:]
		}
	}
	return strings.Join(parts, ",")
}

// CheckTopic applies Kafka's rules for topic names (idemkafka.CheckTopic):
// 1 to 249 characters among ASCII letters, digits, '.', '_' and '-', and
// not "." or "..". The dead-letter topic adds ".dlq", so the name is
// limited to 245 here.
func CheckTopic(t string) error {
	if err := idemkafka.CheckTopic(t); err != nil {
		return fmt.Errorf("bad Kafka %w", err)
	}
	if limit := 249 - len(idemkafka.DeadLetterSuffix); len(t) > limit {
		return fmt.Errorf("bad Kafka topic %q: at most %d characters (its dead-letter topic adds %s)", t, limit, idemkafka.DeadLetterSuffix)
	}
	return nil
}

// kafkaCheckTimeout bounds each try of checkKafka.
const kafkaCheckTimeout = 10 * time.Second

// checkKafka asks the cluster for topic and its dead-letter topic
// (idemkafka.CheckTopics) and for its brokers, once, at start-up: a
// mistyped or unreachable -kafka, or a cluster that refuses idemd (its
// credentials, the TLS handshake, an ACL), must stop idemd (exit 1), not
// leave it serving orders whose events no broker will take (the relay
// retries for ever, the watchdog rejects the orders). The error says
// which. A refused SASL login (the credentials, the mechanism) ends the
// check at once rather than when kafkaCheckTimeout runs out, while kgo
// would retry the connection (connFailures). A cluster that answers
// without the topic or its dead-letter topic
// is a configuration mistake (a *ConfigError, exit 2, naming them): idemd
// never creates topics nor asks the cluster to, so the events would wait
// in the outbox, and a record the consumers cannot apply would hold its
// partition, until an operator created them.
//
// A cluster that no broker of answers (connections refused, names that do
// not resolve yet, no answer within kafkaCheckTimeout: a cluster starting
// beside idemd) is tried again with backoff until ctx ends (the start-up
// bound), as reachDatabase does, rather than failing the start for a
// supervisor to repeat with a growing back-off.
func checkKafka(ctx context.Context, a *App, seeds []string, topic string) error {
	start := time.Now()
	for attempt, wait := 1, reachFirstWait; ; attempt, wait = attempt+1, min(2*wait, reachMaxWait) {
		err := checkKafkaOnce(ctx, a, seeds, topic)
		var ke *kafkaError
		if err == nil || !errors.As(err, &ke) || !ke.unreachable {
			return err
		}
		if ctx.Err() == nil {
			a.log.Warn("kafka unreachable at start-up; retrying", "kafka", strings.Join(seeds, ","),
				"attempt", attempt, "retry_in", wait.String(), "err", ke.msg)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
				continue
			}
		}
		return &kafkaError{msg: fmt.Sprintf("%s (tried %d times in %s)", ke.msg, attempt, since(start)), unreachable: true}
	}
}

// checkKafkaOnce is one try of checkKafka, within kafkaCheckTimeout.
func checkKafkaOnce(ctx context.Context, a *App, seeds []string, topic string) error {
	ctx, cancel := context.WithTimeout(ctx, kafkaCheckTimeout)
	defer cancel()
	auth := a.cfg.KafkaAuth
	brokers := strings.Join(seeds, ",")
	// A TLS handshake that gets no answer (a plaintext listener) fails
	// within the check, so that the error names it.
	opts, err := auth.kgoOpts(kafkaCheckTimeout / 2)
	if err != nil {
		return &ConfigError{msg: fmt.Sprintf("kafka %s: %s", brokers, errMessage(err))}
	}
	// A cluster that refused the SASL login ends the check at once (kgo
	// would retry the connection for the rest of kafkaCheckTimeout):
	// the request then fails with the context, and the refusal is what
	// seen reports.
	seen := &connFailures{refused: cancel}
	cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(seeds...), kgo.WithHooks(seen))...)
	if err != nil {
		return &ConfigError{msg: fmt.Sprintf("kafka %s: %s", brokers, errMessage(err))}
	}
	defer cl.Close()
	dlq := topic + idemkafka.DeadLetterSuffix
	if err := idemkafka.CheckTopics(ctx, cl, topic, dlq); err != nil {
		return topicsCheckError(brokers, auth, topic, err, seen)
	}
	md, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	if err != nil {
		return kafkaCheckError(brokers, auth, topic, err, seen)
	}
	if err := checkSessionTimeout(ctx, a, kadm.NewClient(cl), md); err != nil {
		return err
	}
	if a.cfg.Cleanup != CleanupOff {
		checkRetention(ctx, a, kadm.NewClient(cl), topic)
	}
	return nil
}

// topicsCheckError is checkKafka's error for err, idemkafka.CheckTopics'
// for topic and its dead-letter topic on the cluster of brokers: a
// *ConfigError naming the topics the cluster does not have; otherwise
// what kafkaCheckError says (an ACL, the credentials, unreachable), or
// the topics' errors.
func topicsCheckError(brokers string, auth KafkaAuth, topic string, err error, seen *connFailures) error {
	dlq := topic + idemkafka.DeadLetterSuffix
	var te *idemkafka.TopicsError
	switch {
	case errors.As(err, &te) && len(te.Missing) > 0:
		what, them := "topic", "it"
		if len(te.Missing) > 1 {
			what, them = "topics", "them"
		}
		msg := fmt.Sprintf("kafka %s does not have the %s %s (-kafka-topic %s and its dead-letter topic %s): "+
			"create %s (for example kafka-topics.sh --bootstrap-server %s --create --topic NAME), "+
			"or fix -kafka-topic or -kafka if they name the wrong topic or cluster; idemd does not create topics",
			brokers, what, strings.Join(te.Missing, ", "), topic, dlq, them, strings.SplitN(brokers, ",", 2)[0])
		if len(te.Unauthorized) > 0 || len(te.Failed) > 0 {
			te.Missing = nil
			msg += "; and " + strings.TrimPrefix(te.Error(), "idemkafka: ")
		}
		return &ConfigError{msg: msg}
	case errors.As(err, &te) && len(te.Unauthorized) == 0:
		// Neither missing nor hidden: errors of the topics themselves.
		return &kafkaError{msg: fmt.Sprintf("kafka %s: %s", brokers, strings.TrimPrefix(te.Error(), "idemkafka: "))}
	case te == nil:
		// CheckTopics' wrapping of the request's failure: the message
		// below names the cluster and the cause.
		if cause := errors.Unwrap(err); cause != nil {
			err = cause
		}
	}
	return kafkaCheckError(brokers, auth, topic, err, seen)
}

// checkRetention warns when the events' topic may keep events longer than
// the inboxes remember them (cleanup.DefaultInboxTTL): a consumer group
// that reads such an event again (its offsets expired or were reset to the
// earliest) applies it a second time. Kafka deletes whole segments, once
// their newest record is older than retention.ms, and rolls a segment
// after segment.ms: a record may live retention.ms + segment.ms. It only
// warns: the cluster's retention is the operator's, and a group that keeps
// its offsets never reads that far back.
func checkRetention(ctx context.Context, a *App, adm *kadm.Client, topic string) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	values := map[string]string{}
	if err == nil {
		rc, rerr := rcs.On(topic, nil)
		err = rerr
		if err == nil {
			err = rc.Err
		}
		for _, c := range rc.Configs {
			if c.Value != nil {
				values[c.Key] = *c.Value
			}
		}
	}
	retention, rerr := strconv.ParseInt(values["retention.ms"], 10, 64)
	if err == nil && rerr != nil {
		err = fmt.Errorf("retention.ms %q: %w", values["retention.ms"], rerr)
	}
	if err != nil {
		a.log.Warn("kafka: could not read the topic's retention.ms; make sure retention.ms + segment.ms is at most the inboxes' retention",
			"topic", topic, "inbox_ttl", cleanup.DefaultInboxTTL.String(), "err", err)
		return
	}
	segment, serr := strconv.ParseInt(values["segment.ms"], 10, 64)
	if serr != nil || segment < 0 {
		segment = (7 * 24 * time.Hour).Milliseconds() // Kafka's default
	}
	ttl := cleanup.DefaultInboxTTL.Milliseconds()
	if retention >= 0 && retention <= ttl && segment <= ttl-retention {
		return
	}
	kept := "forever"
	if maxMs := int64(math.MaxInt64 / time.Millisecond); retention >= 0 && retention < maxMs && segment < maxMs-retention {
		kept = (time.Duration(retention+segment) * time.Millisecond).String()
	}
	a.log.Warn("kafka: the topic may keep events longer than the inboxes remember them: a consumer group that reads one of them again "+
		"(its offsets expired, or were reset to the earliest) applies it twice; set retention.ms + segment.ms on the topic "+
		"at most the inbox TTL (for example 60h and 1h), or make sure the groups' offsets never expire",
		"topic", topic, "kept_up_to", kept, "retention_ms", values["retention.ms"], "segment_ms", segment, "inbox_ttl", cleanup.DefaultInboxTTL.String())
}

// checkSessionTimeout refuses, at start-up, a consumer session timeout
// (-kafka-session-timeout) outside the range a broker says it accepts
// (group.min.session.timeout.ms to group.max.session.timeout.ms): the
// group coordinator would refuse every join, and idemd would stop at the
// consumers' first join instead, after it began serving. A broker that
// does not say (no DescribeConfigs right on the cluster, a value it does
// not report) is not checked here: the first join still refuses it.
func checkSessionTimeout(ctx context.Context, a *App, adm *kadm.Client, md kadm.Metadata) error {
	want := a.cfg.KafkaSessionTimeout
	rcs, err := adm.DescribeBrokerConfigs(ctx, md.Brokers.NodeIDs()...)
	if err != nil {
		a.log.Info("kafka: could not read the brokers' session timeout range; the consumers' first join checks it",
			"session_timeout", want.String(), "err", err)
		return nil
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			a.log.Info("kafka: could not read a broker's session timeout range; the consumers' first join checks it",
				"broker", rc.Name, "session_timeout", want.String(), "err", rc.Err)
			continue
		}
		lo, loOK := configMillis(rc.Configs, "group.min.session.timeout.ms")
		hi, hiOK := configMillis(rc.Configs, "group.max.session.timeout.ms")
		if !loOK || !hiOK || (want >= lo && want <= hi) {
			continue
		}
		return configErrorf("kafka: broker %s accepts consumer group session timeouts from %v to %v "+
			"(group.min.session.timeout.ms, group.max.session.timeout.ms); -kafka-session-timeout %v is outside: "+
			"set it within that range, or change the brokers' settings", rc.Name, lo, hi, want)
	}
	return nil
}

// configMillis returns the value of the config key in milliseconds.
func configMillis(configs []kadm.Config, key string) (time.Duration, bool) {
	for _, c := range configs {
		if c.Key != key || c.Value == nil {
			continue
		}
		ms, err := strconv.ParseInt(*c.Value, 10, 64)
		if err != nil || ms < 0 || ms > int64(math.MaxInt64/time.Millisecond) {
			return 0, false
		}
		return time.Duration(ms) * time.Millisecond, true
	}
	return 0, false
}
