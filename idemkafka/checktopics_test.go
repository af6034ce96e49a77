package idemkafka_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// checkCtx bounds a CheckTopics call of the tests.
func checkCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A consumer's topics and their dead-letter topics all exist: nil, with
// one metadata request.
func TestCheckTopicsPresent(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "present", 2)
	kc.CreateTopic(t, topic+idemkafka.DeadLetterSuffix, 1)
	cfg := idemkafka.ConsumerConfig[sqlTx]{Topics: []string{topic}}
	var requests *kfake.FaultHandle
	if !kc.Real() {
		requests = kc.Fake(t).Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: topic, Observe: true, Count: -1})
	}
	if err := idemkafka.CheckTopics(checkCtx(t), kc.Client(t), cfg.RequiredTopics()...); err != nil {
		t.Fatalf("CheckTopics(%v): %v", cfg.RequiredTopics(), err)
	}
	if requests != nil {
		if n := requests.Hits(); n != 1 {
			t.Errorf("%d metadata requests for %s; want 1", n, topic)
		}
	}
}

// Missing topics, and only those, are named in a *TopicsError that wraps
// ErrTopicMissing and says what to do; none is created, not even by a
// cluster that creates topics on demand for a client that asks.
func TestCheckTopicsMissing(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t, kfake.AllowAutoTopicCreation())
	present := kc.Topic(t, "present", 1)
	missing1, missing2 := kafkatest.Name("missing"), kafkatest.Name("missing")
	cl := kc.Client(t, kgo.AllowAutoTopicCreation())
	err := idemkafka.CheckTopics(checkCtx(t), cl, missing1, present, missing2, missing1)
	var te *idemkafka.TopicsError
	if !errors.As(err, &te) {
		t.Fatalf("CheckTopics: %v (%T); want a *TopicsError", err, err)
	}
	if !slices.Equal(te.Missing, []string{missing1, missing2}) || len(te.Unauthorized) != 0 || len(te.Failed) != 0 {
		t.Errorf("TopicsError %+v; want Missing [%s %s] only", te, missing1, missing2)
	}
	if !errors.Is(err, idemkafka.ErrTopicMissing) || !errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Errorf("CheckTopics: %v; want it to wrap ErrTopicMissing and UNKNOWN_TOPIC_OR_PARTITION, not TOPIC_AUTHORIZATION_FAILED", err)
	}
	for _, want := range []string{
		"the brokers do not have the topics " + missing1 + ", " + missing2 + ": create them, or enable auto-creation",
		"auto.create.topics.enable", "kgo.AllowAutoTopicCreation",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CheckTopics: %q; want it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), present) {
		t.Errorf("CheckTopics: %q names the present topic %s", err, present)
	}
	// Not created: asked again, still missing.
	err = idemkafka.CheckTopics(checkCtx(t), cl, missing1)
	if !errors.As(err, &te) || !slices.Equal(te.Missing, []string{missing1}) {
		t.Errorf("CheckTopics again: %v; want %s still missing (not created)", err, missing1)
	}
}

// A consumer whose topic exists but not its dead-letter topic: the
// dead-letter topic is missing (RequiredTopics lists it).
func TestCheckTopicsDeadLetterMissing(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "nodlq", 1)
	cfg := idemkafka.ConsumerConfig[sqlTx]{Topics: []string{topic}}
	err := idemkafka.CheckTopics(checkCtx(t), kc.Client(t), cfg.RequiredTopics()...)
	var te *idemkafka.TopicsError
	if !errors.As(err, &te) || !slices.Equal(te.Missing, []string{topic + ".dlq"}) {
		t.Fatalf("CheckTopics: %v; want a *TopicsError with Missing [%s.dlq]", err, topic)
	}
	if !errors.Is(err, idemkafka.ErrTopicMissing) || !strings.Contains(err.Error(), topic+".dlq: create them") {
		t.Errorf("CheckTopics: %q; want ErrTopicMissing naming %s.dlq", err, topic)
	}
}

// A topic the client may not describe is reported as such, not as
// missing, beside a missing one.
func TestCheckTopicsUnauthorized(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	denied := kc.Topic(t, "denied", 1)
	missing := kafkatest.Name("missing")
	kc.Fake(t).Fault(kfakeFault(kmsg.Metadata, denied, kerr.TopicAuthorizationFailed, -1))
	err := idemkafka.CheckTopics(checkCtx(t), kc.Client(t), denied, missing)
	var te *idemkafka.TopicsError
	if !errors.As(err, &te) {
		t.Fatalf("CheckTopics: %v (%T); want a *TopicsError", err, err)
	}
	if !slices.Equal(te.Unauthorized, []string{denied}) || !slices.Equal(te.Missing, []string{missing}) {
		t.Errorf("TopicsError %+v; want Unauthorized [%s] and Missing [%s]", te, denied, missing)
	}
	if !errors.Is(err, kerr.TopicAuthorizationFailed) || !errors.Is(err, idemkafka.ErrTopicMissing) {
		t.Errorf("CheckTopics: %v; want TOPIC_AUTHORIZATION_FAILED and ErrTopicMissing", err)
	}
	want := "the client may not describe the topics " + denied + " (TOPIC_AUTHORIZATION_FAILED"
	if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "do not have the topics "+denied) {
		t.Errorf("CheckTopics: %q; want it to say %q, and not that %s is missing", err, want, denied)
	}

	// Alone, the denied topic is not missing.
	err = idemkafka.CheckTopics(checkCtx(t), kc.Client(t), denied)
	if !errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, idemkafka.ErrTopicMissing) {
		t.Errorf("CheckTopics(%s): %v; want TOPIC_AUTHORIZATION_FAILED, not ErrTopicMissing", denied, err)
	}
}

// No broker answers: an error that says the brokers could not be reached,
// not a *TopicsError, within the context's deadline; a refused
// connection fails at once.
func TestCheckTopicsUnreachable(t *testing.T) {
	t.Parallel()
	// A listener that accepts connections and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		connsMu sync.Mutex
		conns   []net.Conn
	)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, c)
			connsMu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = silent.Close()
		connsMu.Lock()
		defer connsMu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	// A port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()

	for _, tc := range []struct {
		name, seed string
		wantCtx    bool
	}{
		{"silent", silent.Addr().String(), true},
		{"refused", closed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := kgo.NewClient(kgo.SeedBrokers(tc.seed))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = idemkafka.CheckTopics(ctx, cl, "orders", "orders.dlq")
			took := time.Since(start)
			if took > 5*time.Second {
				t.Errorf("CheckTopics took %v with a 300ms context", took)
			}
			var te *idemkafka.TopicsError
			if err == nil || errors.As(err, &te) || errors.Is(err, idemkafka.ErrTopicMissing) {
				t.Fatalf("CheckTopics: %v; want an error that is not about missing topics", err)
			}
			if want := "could not reach the brokers (" + tc.seed + ")"; !strings.Contains(err.Error(), want) {
				t.Errorf("CheckTopics: %q; want it to say %q", err, want)
			}
			if tc.wantCtx && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("CheckTopics: %v; want it to wrap context.DeadlineExceeded", err)
			}
		})
	}
}

// Arguments refused without I/O.
func TestCheckTopicsArguments(t *testing.T) {
	t.Parallel()
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tc := range []struct {
		name   string
		cl     *kgo.Client
		topics []string
		want   string
	}{
		{"nil client", nil, []string{"orders"}, "nil client"},
		{"no topics", cl, nil, "no topics"},
		{"bad name", cl, []string{"orders", "or ders"}, `topic "or ders"`},
	} {
		err := idemkafka.CheckTopics(t.Context(), tc.cl, tc.topics...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "reach") {
			t.Errorf("%s: CheckTopics: %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// RequiredTopics lists the topics, then their dead-letter topics, each
// once.
func TestConsumerConfigRequiredTopics(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		topics []string
		dlq    string
		want   []string
	}{
		{[]string{"orders"}, "", []string{"orders", "orders.dlq"}},
		{[]string{"orders", "payments", "orders"}, "", []string{"orders", "payments", "orders.dlq", "payments.dlq"}},
		{[]string{"orders", "payments"}, "dead", []string{"orders", "payments", "dead"}},
		{nil, "", nil},
	} {
		cfg := idemkafka.ConsumerConfig[sqlTx]{Topics: tc.topics, DeadLetterTopic: tc.dlq}
		if got := cfg.RequiredTopics(); !slices.Equal(got, tc.want) {
			t.Errorf("Topics %v, DeadLetterTopic %q: RequiredTopics() = %v; want %v", tc.topics, tc.dlq, got, tc.want)
		}
	}
}
