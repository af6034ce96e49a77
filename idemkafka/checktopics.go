package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrTopicMissing is wrapped by CheckTopics' error (a *TopicsError) when
// the brokers answered that they do not have a topic asked for.
var ErrTopicMissing = errors.New("idemkafka: topic does not exist")

// missingTopicsFix says what to do about missing topics.
const missingTopicsFix = "create them, or enable auto-creation " +
	"(auto.create.topics.enable on the broker, and kgo.AllowAutoTopicCreation in the clients' options)"

// TopicsError is CheckTopics' error when the brokers answered but do not
// have every topic asked for, or do not show them to the client. It wraps
// ErrTopicMissing and kerr.UnknownTopicOrPartition when Missing is not
// empty, kerr.TopicAuthorizationFailed when Unauthorized is not, and each
// error of Failed.
type TopicsError struct {
	// Missing are the topics the brokers do not have
	// (UNKNOWN_TOPIC_OR_PARTITION), in the order asked.
	Missing []string
	// Unauthorized are the topics the client may not describe
	// (TOPIC_AUTHORIZATION_FAILED: an ACL is missing), in the order
	// asked. Kafka answers so whether the topic exists or not.
	Unauthorized []string
	// Failed are the other topics the brokers answered with an error that
	// retrying does not fix, with that error.
	Failed map[string]error
}

func (e *TopicsError) Error() string {
	var parts []string
	if len(e.Missing) > 0 {
		parts = append(parts, fmt.Sprintf("the brokers do not have the topics %s: %s",
			strings.Join(e.Missing, ", "), missingTopicsFix))
	}
	if len(e.Unauthorized) > 0 {
		parts = append(parts, fmt.Sprintf("the client may not describe the topics %s (TOPIC_AUTHORIZATION_FAILED: an ACL is missing; "+
			"they may exist): grant its principal DESCRIBE on them, with READ to consume and WRITE to publish or dead-letter",
			strings.Join(e.Unauthorized, ", ")))
	}
	for _, t := range e.failedTopics() {
		parts = append(parts, fmt.Sprintf("topic %s: %v", t, e.Failed[t]))
	}
	return "idemkafka: " + strings.Join(parts, "; ")
}

// Unwrap returns ErrTopicMissing and kerr.UnknownTopicOrPartition (some
// topics are missing), kerr.TopicAuthorizationFailed (some may not be
// described) and the errors of Failed.
func (e *TopicsError) Unwrap() []error {
	var errs []error
	if len(e.Missing) > 0 {
		errs = append(errs, ErrTopicMissing, kerr.UnknownTopicOrPartition)
	}
	if len(e.Unauthorized) > 0 {
		errs = append(errs, kerr.TopicAuthorizationFailed)
	}
	for _, t := range e.failedTopics() {
		errs = append(errs, e.Failed[t])
	}
	return errs
}

func (e *TopicsError) failedTopics() []string {
	ts := make([]string, 0, len(e.Failed))
	for t := range e.Failed {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// CheckTopics asks the brokers of cl, with one metadata request, whether
// they have topics, and returns nil if they have them all. Call it at
// start-up, before the consumers and the relay run, so that a topic that
// was not created (or a typo in its name) stops the service at once
// instead of showing up later only as a backlog: a publish to a missing
// topic fails and the event waits in the outbox, a consumer of a missing
// topic waits for it, a record to dead-letter holds its partition until
// the dead-letter topic exists. ConsumerConfig.RequiredTopics lists what a
// consumer needs (its topics and their dead-letter topics); a publisher
// needs its DefaultTopic and each topic its Topic function picks.
//
// It never creates a topic: it asks the brokers not to, even when cl has
// kgo.AllowAutoTopicCreation, so a service that relies on topics created
// on first use should not call it. Topic names are checked first
// (CheckTopic), without I/O.
//
// The error is:
//   - a *TopicsError when the brokers answered and some topics are missing
//     (it wraps ErrTopicMissing, and kerr.UnknownTopicOrPartition as
//     Publish's error does for such a topic) or may not be described by
//     the client (kerr.TopicAuthorizationFailed; not reported as missing);
//     the message names them all and says what to do;
//   - when the brokers cannot be reached (a connection refused, a host
//     name that does not resolve, no answer before ctx ends), an error
//     that says so ("could not reach the brokers") and wraps the cause:
//     ctx's error, or the connection's (kgo gives up on a refused
//     connection at once rather than retry it); ctx bounds the wait;
//   - otherwise the request's error (refused credentials, a TLS failure,
//     CLUSTER_AUTHORIZATION_FAILED), wrapped.
//
// Only a *TopicsError says something about the topics: a service that
// should start while Kafka is down (the outbox keeps the events, the
// consumers wait for the brokers) can refuse to start on it alone.
//
// A topic that exists but has no leader yet (LEADER_NOT_AVAILABLE, just
// created) counts as present.
func CheckTopics(ctx context.Context, cl *kgo.Client, topics ...string) error {
	if cl == nil {
		return errors.New("idemkafka: CheckTopics: nil client")
	}
	if len(topics) == 0 {
		return errors.New("idemkafka: CheckTopics: no topics given")
	}
	var (
		asked []string
		bad   []error
	)
	for _, t := range topics {
		if err := CheckTopic(t); err != nil {
			bad = append(bad, err)
			continue
		}
		if !slices.Contains(asked, t) {
			asked = append(asked, t)
		}
	}
	if err := errors.Join(bad...); err != nil {
		return fmt.Errorf("idemkafka: CheckTopics: %w", err)
	}
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	for _, t := range asked {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		seeds, _ := cl.OptValue(kgo.SeedBrokers).([]string)
		if unreachable(ctx, err) {
			return fmt.Errorf("idemkafka: CheckTopics %s: could not reach the brokers (%s): %w",
				strings.Join(asked, ", "), strings.Join(seeds, ","), err)
		}
		return fmt.Errorf("idemkafka: CheckTopics %s: the metadata request to the brokers (%s) failed: %w",
			strings.Join(asked, ", "), strings.Join(seeds, ","), err)
	}
	answers := make(map[string]int16, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic != nil {
			answers[*t.Topic] = t.ErrorCode
		}
	}
	te := &TopicsError{}
	for _, t := range asked {
		code, ok := answers[t]
		if !ok { // a broker answers every topic asked for
			code = kerr.UnknownTopicOrPartition.Code
		}
		err := kerr.ErrorForCode(code)
		var ke *kerr.Error
		switch {
		case err == nil:
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			te.Missing = append(te.Missing, t)
		case errors.Is(err, kerr.TopicAuthorizationFailed):
			te.Unauthorized = append(te.Unauthorized, t)
		case errors.As(err, &ke) && ke.Retriable:
			// LEADER_NOT_AVAILABLE and the like: the topic exists.
		default:
			if te.Failed == nil {
				te.Failed = map[string]error{}
			}
			te.Failed[t] = err
		}
	}
	if len(te.Missing) == 0 && len(te.Unauthorized) == 0 && len(te.Failed) == 0 {
		return nil
	}
	return te
}

// unreachable reports whether err, a request's failure, means that no
// broker answered: ctx ended first, or connections failed.
func unreachable(ctx context.Context, err error) bool {
	var (
		op  *net.OpError
		dns *net.DNSError
	)
	return ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.As(err, &op) || errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED)
}

// RequiredTopics returns the topics the consumer needs: Topics, then their
// dead-letter topics (DeadLetterTopic, or each topic followed by
// DeadLetterSuffix), each once. They are the topics to create before it
// runs, and to give CheckTopics.
func (c ConsumerConfig[TTx]) RequiredTopics() []string {
	var ts []string
	add := func(t string) {
		if !slices.Contains(ts, t) {
			ts = append(ts, t)
		}
	}
	for _, t := range c.Topics {
		add(t)
	}
	for _, t := range c.Topics {
		add(c.deadLetterTopic(t))
	}
	return ts
}
