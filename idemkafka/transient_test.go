package idemkafka_test

import (
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
	topic := kc.Topic(t, "orders", 1)
	kc.CreateTopic(t, topic+idemkafka.DeadLetterSuffix, 1)
	group := kafkatest.Name("g")
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
