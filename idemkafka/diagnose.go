package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/event"
)

// kgo retries a record whose partition the broker answers with a retriable
// error (NOT_ENOUGH_REPLICAS while fewer replicas than the topic's
// min.insync.replicas are in sync, NOT_LEADER_OR_FOLLOWER and
// LEADER_NOT_AVAILABLE during a leader election, REQUEST_TIMED_OUT) until
// it is written, and tells no one of that error: the record only fails
// when the Publish's context ends ("context deadline exceeded") or its
// straggler wait does (ErrOutcomeUnknown), and the relay logged that, not
// why. diagnose asks the cluster's metadata about such a record's topic
// and appends what it says (leaders missing, replicas out of sync) to the
// record's error, after the broker's last answer to the topic when the
// publisher read one (see answers.go), so the relay's "publish failed"
// line and the events' last_error name the cause.

// diagnoseTimeout bounds the metadata request of a diagnosis.
const diagnoseTimeout = 2 * time.Second

// diagnoseTTL is how long a topic's diagnosis is reused: a relay that fails
// round after round asks the cluster at most this often per topic.
const diagnoseTTL = 5 * time.Second

// diagnosis is a topic's note, and when it was made. answered: the
// metadata request succeeded; missing: it said the brokers do not have the
// topic.
type diagnosis struct {
	note     string
	at       time.Time
	answered bool
	missing  bool
}

// diagnoses caches the notes of topics (see Publisher.explain).
type diagnoses struct {
	mu    sync.Mutex
	notes map[string]diagnosis
}

// unanswered reports whether err, a record's error, says only that the
// record was not acknowledged in time: no answer from the broker says why.
func unanswered(err error) bool {
	return errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, context.DeadlineExceeded)
}

// explain appends to each error of errs (those of events) that is
// unanswered the brokers' last error answers to the event's topic, if the
// client told one (see answerLogger), and what the cluster's metadata says
// of the topic. It asks the metadata only after a Publish that failed so,
// not when ctx was cancelled (a relay stopping).
func (p *Publisher) explain(ctx context.Context, cl *kgo.Client, events []event.Envelope, errs []error) {
	var topics []string
	for i, err := range errs {
		if err != nil && unanswered(err) {
			if t := p.topic(events[i]); t != "" && !slices.Contains(topics, t) {
				topics = append(topics, t)
			}
		}
	}
	if len(topics) == 0 {
		return
	}
	now := time.Now()
	answers := make(map[string]error, len(topics))
	for _, t := range topics {
		if a := p.answers.forTopic(t, now); a != nil {
			answers[t] = a
		}
	}
	var notes map[string]diagnosis
	if cl != nil && !errors.Is(ctx.Err(), context.Canceled) {
		notes = p.diag.notesFor(ctx, cl, topics)
		for t, d := range notes {
			if d.missing {
				p.forgetKnown(t)
			}
		}
	}
	for i, err := range errs {
		if err == nil || !unanswered(err) {
			continue
		}
		t := p.topic(events[i])
		if a := answers[t]; a != nil {
			err = fmt.Errorf("%w: %w", err, a)
		}
		if note := notes[t].note; note != "" {
			err = fmt.Errorf("%w (%s)", err, note)
		}
		errs[i] = err
	}
}

// notesFor returns the diagnoses of topics, asking the cluster about those
// without a recent one.
func (d *diagnoses) notesFor(ctx context.Context, cl *kgo.Client, topics []string) map[string]diagnosis {
	now := time.Now()
	out := make(map[string]diagnosis, len(topics))
	var ask []string
	d.mu.Lock()
	for _, t := range topics {
		if n, ok := d.notes[t]; ok && now.Sub(n.at) < diagnoseTTL {
			out[t] = n
		} else {
			ask = append(ask, t)
		}
	}
	d.mu.Unlock()
	if len(ask) == 0 {
		return out
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), diagnoseTimeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range ask {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(mctx, cl)
	fresh := make(map[string]diagnosis, len(ask))
	for _, t := range ask {
		fresh[t] = diagnosis{note: "the cluster's metadata could not be read either: the brokers do not answer?", at: now}
		if err == nil {
			fresh[t] = diagnosis{note: "the cluster's metadata does not list the topic", at: now, answered: true, missing: true}
		}
	}
	if err == nil {
		for _, rt := range resp.Topics {
			if rt.Topic != nil && slices.Contains(ask, *rt.Topic) {
				fresh[*rt.Topic] = diagnosis{note: topicNote(rt), at: now, answered: true,
					missing: rt.ErrorCode == kerr.UnknownTopicOrPartition.Code}
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.notes == nil {
		d.notes = map[string]diagnosis{}
	}
	for t, n := range fresh {
		d.notes[t] = n
		out[t] = n
	}
	for t, n := range d.notes {
		if now.Sub(n.at) >= diagnoseTTL {
			delete(d.notes, t)
		}
	}
	return out
}

// topicNote says what a topic's metadata tells of why its records are not
// acknowledged. Its text is stable while the fault lasts (the relay groups
// its failures by their text, every number being equal).
func topicNote(rt kmsg.MetadataResponseTopic) string {
	if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
		return fmt.Sprintf("the cluster's metadata answers %v for the topic", err)
	}
	var noLeader, shrunk int
	var leaderErr error
	minISR, replicas := -1, 0
	for _, p := range rt.Partitions {
		if err := kerr.ErrorForCode(p.ErrorCode); p.Leader < 0 || (err != nil && !errors.Is(err, kerr.ReplicaNotAvailable)) {
			noLeader++
			if err != nil && leaderErr == nil {
				leaderErr = err
			}
			continue
		}
		if len(p.ISR) < len(p.Replicas) {
			shrunk++
			if minISR < 0 || len(p.ISR) < minISR {
				minISR, replicas = len(p.ISR), len(p.Replicas)
			}
		}
	}
	switch {
	case noLeader > 0 && leaderErr != nil:
		return fmt.Sprintf("the cluster's metadata shows %d of %d partitions without a leader (%v): a leader election, or their brokers down", noLeader, len(rt.Partitions), leaderErr)
	case noLeader > 0:
		return fmt.Sprintf("the cluster's metadata shows %d of %d partitions without a leader: a leader election, or their brokers down", noLeader, len(rt.Partitions))
	case shrunk > 0:
		return fmt.Sprintf("the cluster's metadata shows %d of %d partitions with replicas out of sync (as few as %d of %d in sync): "+
			"below the topic's min.insync.replicas, brokers refuse acks=all writes with NOT_ENOUGH_REPLICAS until the replicas catch up",
			shrunk, len(rt.Partitions), minISR, replicas)
	default:
		return "the cluster's metadata shows every partition with a leader and its replicas in sync: " +
			"the leaders do not answer in time, or answer a retriable error (NOT_LEADER_OR_FOLLOWER after an election, NOT_ENOUGH_REPLICAS); " +
			"kgo retries the records until they are written"
	}
}
