package idemkafka_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
)

// A topic whose broker refuses the records with a retriable error
// (NOT_ENOUGH_REPLICAS), which kgo retries without telling anyone, and a
// relay round whose context ends while kgo is still retrying them: the
// events' last_error (what an operator reads in the outbox, the admin API
// and the relay's log to learn why they do not go out) names the broker's
// answer. It said only "not acknowledged in time; outcome unknown", with
// what the cluster's metadata suggests: every partition in sync, "the
// leaders do not answer in time, or answer a retriable error
// (NOT_LEADER_OR_FOLLOWER after an election, NOT_ENOUGH_REPLICAS)", or,
// when the metadata could not be read within 2 s (a loaded machine), "the
// brokers do not answer?" and nothing of the broker's reason
// (TestRelayOneTopicFailingOthersFlow/not_enough_replicas passed only on
// the metadata's guess). The broker's answer is the first retry kgo got:
// without the fix nothing had it.
func TestRelayRefusedRecordsLastErrorNamesBrokerAnswer(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "payments", 3)
	fault := fake.Fault(kfakeFault(kmsg.Produce, topic, kerr.NotEnoughReplicas, -1))
	// The relay's and the client's defaults, but a round's context of 1 s:
	// it ends while kgo retries the records (every MetadataMinAge, 5 s).
	r := newPGRelayRig(t, kc, topic, outbox.RelayConfig{PublishTimeout: time.Second})
	evs := newEvents(t, 6, 3)
	r.enqueue(t, evs...)
	if n, err := r.relay.RunOnce(t.Context()); err == nil || n != 0 {
		t.Fatalf("RunOnce: %d published, err %v; want none published and an error", n, err)
	}
	if fault.Hits() == 0 {
		t.Fatal("the broker never refused a record")
	}
	want := kerr.NotEnoughReplicas.Error() // the broker's answer, with its description
	failed := 0
	for _, o := range r.rows(t) {
		if o.Published || o.Parked {
			t.Errorf("event %s: published %v, parked %v; want it pending", o.EventID, o.Published, o.Parked)
		}
		if o.Attempts == 0 {
			continue
		}
		failed++
		if failed == 1 {
			t.Logf("last_error: %s", o.LastError)
		}
		if !strings.Contains(o.LastError, want) {
			t.Errorf("event %s: last_error %q; want it to name the broker's answer %q", o.EventID, o.LastError, want)
		}
	}
	if failed != 3 { // each key's first event
		t.Errorf("%d events failed; want the 3 keys' first ones", failed)
	}
	if _, with := logLines(r.logs.String(), "WARN", want); with == 0 {
		t.Errorf("no WARN line names %q; logs:\n%s", want, r.logs.String())
	}
}

// Publish's error for a record that kgo still retries when the call gives
// up waiting (its context ended, then the straggler wait) wraps the
// broker's last answer for the record's topic as a kerr error, besides
// ErrOutcomeUnknown.
func TestPublishNotAcknowledgedWrapsBrokerAnswer(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "payments", 3)
	fake.Fault(kfakeFault(kmsg.Produce, topic, kerr.NotEnoughReplicas, -1))
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic})
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	err := p.Publish(ctx, newEvents(t, 1, 1))
	var pe *outbox.PublishError
	if !errors.As(err, &pe) || len(pe.Errs) != 1 {
		t.Fatalf("Publish: %v; want a PublishError for 1 event", err)
	}
	if e := pe.Errs[0]; !errors.Is(e, idemkafka.ErrOutcomeUnknown) || !errors.Is(e, kerr.NotEnoughReplicas) {
		t.Errorf("the event's error: %v; want it to wrap ErrOutcomeUnknown and kerr.NotEnoughReplicas", e)
	}
}
