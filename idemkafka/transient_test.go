package idemkafka_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// A database error inside the handler (a deadlock, a lock timeout) is the
// database's, not the record's: retried as long as it lasts (rewinding the
// partition when the tries run out), never dead-lettered. Three lock
// timeouts dead-lettered a valid event before.
func TestTransientHandlerErrorNotDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 1, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	var tries atomic.Int32
	hook := func(e event.Envelope) error {
		if tries.Add(1) <= 3 { // e.g. 3 lock timeouts while a migration holds a lock
			return &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
		}
		return nil
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic))
	waitFor(t, 15*time.Second, "committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	if s := inst.stats.get(); s.dead != 0 || s.applied != 1 {
		t.Fatalf("after 3 lock timeouts: %d dead-lettered, %d applied; want 0 and 1", s.dead, s.applied)
	}
}

// An HTTP call's failure is the record's, not the database's, even though
// *url.Error is a net.Error: a handler that fails for good on it is
// dead-lettered after Retry.Attempts and the records behind it are applied.
// It was retried as a database outage for ever before, stalling the
// partition.
func TestHTTPHandlerErrorDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 2, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	var tries atomic.Int32
	hook := func(e event.Envelope) error {
		if e.ID != evs[0].ID {
			return nil
		}
		tries.Add(1)
		resp, err := http.Get("htp://x") // unsupported protocol scheme: fails for good
		if err != nil {
			return fmt.Errorf("notify: %w", err)
		}
		resp.Body.Close()
		return nil
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic))
	waitFor(t, 30*time.Second, "committed", func() bool { return allCommitted(t, kc, group, topic) }) // 4 s were too few on a busy machine
	mustStop(t, inst)
	if s := inst.stats.get(); s.dead != 1 || s.applied != 1 {
		t.Fatalf("%d dead-lettered, %d applied; want 1 and 1", s.dead, s.applied)
	}
	if n := tries.Load(); n != 3 {
		t.Errorf("the handler was tried %d times; want Retry.Attempts (3)", n)
	}
	rs := kc.Records(t, dlq)
	if len(rs) != 1 {
		t.Fatalf("%d dead letters; want 1", len(rs))
	}
	for _, h := range rs[0].Headers {
		if h.Key == idemkafka.HeaderDLQError && !strings.Contains(string(h.Value), "unsupported protocol scheme") {
			t.Errorf("%s = %q; want the HTTP error", h.Key, h.Value)
		}
	}
}
