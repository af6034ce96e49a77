package idemkafka_test

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
)

// A rolling deploy that upgraded a producer before its consumers: the old
// consumer dead-letters the event version it does not know (its handler
// returns ErrPoison), a record whose payload does not decode and a
// CloudEvent in structured mode, and the partition goes on. Once the
// consumers know the new version, the dead letters copied back to the
// event topic as they are (key, value and headers, the dead-letter headers
// included) are applied once, with their original event ID and extra
// headers, however many times they are copied; the events already applied
// are dropped as duplicates.
func TestDeadLetterReplayAfterUpgrade(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)

	evs := newEvents(t, 6, 2)
	extra := map[string]string{"tenant": "acme", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	v2 := evs[2]
	v2.Type, v2.Headers = "OrderCreated.v2", extra
	evs[2] = v2
	ce := evs[4] // a CloudEvents producer's, in the new version too
	ce.Type, ce.Headers = "OrderCreated.v2", map[string]string{"tenant": "globex"}
	evs[4] = ce
	rs := recordsOf(topic, evs...)
	var err error
	if rs[4], err = idemkafka.RecordWith(topic, ce, event.HeaderOptions{Format: event.HeaderFormatCloudEvents, Source: "/orders"}); err != nil {
		t.Fatal(err)
	}
	truncated := idemkafka.Record(topic, evs[5])
	truncated.Value = truncated.Value[:len(truncated.Value)-1]
	// A CloudEvent in structured mode: the event in the value, no ce_ header.
	structured := &kgo.Record{Key: []byte("order-9"), Value: []byte(`{"specversion":"1.0","id":"` + uuid.Must(uuid.NewV7()).String() + `","type":"OrderCreated.v2","source":"/java","data":{}}`),
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}}}
	rs = append(rs, truncated, structured)
	kc.Produce(t, topic, rs...)

	var (
		mu   sync.Mutex
		seen = map[uuid.UUID]map[string]string{}
	)
	consume := func(group string, knows func(typ string) bool) *instance {
		hook := func(e event.Envelope) error {
			if !knows(e.Type) {
				return fmt.Errorf("%w: %s is a version this consumer does not know", idemkafka.ErrPoison, e.Type)
			}
			mu.Lock()
			seen[e.ID] = e.Headers
			mu.Unlock()
			return nil
		}
		return start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic))
	}

	// The old consumer knows v1 only.
	group := kafkatest.Name("g")
	old := consume(group, func(typ string) bool { return typ == "OrderCreated.v1" })
	waitFor(t, 30*time.Second, "the old consumer committed to the end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, old)
	mustOnce(t, b, "billing", []event.Envelope{evs[0], evs[1], evs[3], evs[5]})
	if s := old.stats.get(); s.dead != 4 {
		t.Fatalf("old consumer dead-lettered %d records; want 4 (two v2, one truncated, one structured)", s.dead)
	}
	dead := kc.Records(t, dlq)
	if len(dead) != 4 {
		t.Fatalf("dead-letter topic holds %d records; want 4", len(dead))
	}
	var replay []*kgo.Record
	for _, d := range dead {
		if strings.Contains(header(d, idemkafka.HeaderDLQError), "does not know") {
			// Copied as it is, twice (an operator who ran the replay again).
			for range 2 {
				replay = append(replay, &kgo.Record{Key: d.Key, Value: d.Value, Headers: d.Headers})
			}
		} else if msg := header(d, idemkafka.HeaderDLQError); !strings.Contains(msg, "not valid JSON") && !strings.Contains(msg, "structured mode") {
			t.Errorf("dead letter %s: %s; want a payload that is not JSON, or a CloudEvent in structured mode", header(d, idemkafka.HeaderDLQOffset), msg)
		} else if got := header(d, idemkafka.HeaderDLQAttempts); got != "0" {
			t.Errorf("dead letter %s not decoded: %s attempts; want 0", header(d, idemkafka.HeaderDLQOffset), got)
		}
	}
	if len(replay) != 4 {
		t.Fatalf("%d v2 dead letters to replay; want 2 (twice each)", len(replay)/2)
	}
	// And the v1 events again, as a redrive from the outbox would.
	kc.Produce(t, topic, append(replay, recordsOf(topic, evs[0], evs[1])...)...)

	// The upgraded consumer knows both versions.
	upgraded := consume(group, func(typ string) bool { return strings.HasPrefix(typ, "OrderCreated.") })
	waitFor(t, 30*time.Second, "the upgraded consumer committed to the end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, upgraded)
	mustOnce(t, b, "billing", evs[:6])
	if s := upgraded.stats.get(); s.applied != 2 || s.duplicates != 4 || s.dead != 0 {
		t.Errorf("upgraded consumer: applied %d, duplicates %d, dead-lettered %d; want 2, 4, 0", s.applied, s.duplicates, s.dead)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []event.Envelope{v2, ce} {
		if got := seen[want.ID]; !maps.Equal(got, want.Headers) {
			t.Errorf("replayed %s: headers %v; want the original %v (no dead-letter or CloudEvents headers)", want.ID, got, want.Headers)
		}
	}
}
