package app_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
)

// An outbox event Kafka can never take (here one over the client's batch
// size) is parked: idemd_outbox_parked_total, exported at 0 from the
// start, counts it, and the gauge idemd_outbox_parked_events shows it
// parked until an operator unparks it (the runbook's statement), then
// falls to 0 while the counter stays. The consumer groups' lag is
// exported too.
func TestParkedEventCounted(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			testParkedEventCounted(t, kind)
		})
	}
}

func testParkedEventCounted(t *testing.T, kind string) {
	dbArg, count := dbCounter(t, kind)
	exec := dbExecer(t, dbArg)
	s := serveWith(t, dbArg, count, []app.Option{app.WithParkedInterval(50 * time.Millisecond)})
	metrics := func() string { return string(s.do(http.MethodGet, "/metrics", "", "").body) }
	metric := func(line string) bool { return strings.Contains(metrics(), "\n"+line+"\n") }
	waitMetric := func(line string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !metric(line); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q:\n%s", line, grepLines(metrics(), "idemd_outbox"))
			}
		}
	}
	if !metric("idemd_outbox_parked_total 0") || !metric("idemd_outbox_parked_events 0") {
		t.Errorf("idemd_outbox_parked_total and idemd_outbox_parked_events are not exported at 0 from the start:\n%s",
			grepLines(metrics(), "idemd_outbox"))
	}
	r := s.do(http.MethodPost, "/v1/orders", "poison", orderBody(42, "19.90"))
	if r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	id, _ := r.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")
	s.waitCount(unpublished(kind), 0)
	// Its OrderCreated.v1 event to be published again, now 1.6 MB: over
	// the producer's batch size, poison.
	exec(`CREATE TABLE saved_payload AS SELECT id, payload FROM outbox WHERE event_type = 'OrderCreated.v1'`)
	if kind == app.Postgres {
		exec(`UPDATE outbox SET payload = convert_to('{"pad":"' || repeat('ab', 800000) || '"}', 'UTF8')
			WHERE event_type = 'OrderCreated.v1'`)
		exec(`WITH d AS (DELETE FROM outbox_published WHERE id IN (SELECT id FROM saved_payload) RETURNING id)
			INSERT INTO outbox_pending (id, record_key) SELECT o.id, o.record_key FROM outbox o JOIN d USING (id)`)
	} else {
		exec(`UPDATE outbox SET published_at = NULL, payload = CAST('{"pad":"' || hex(randomblob(800000)) || '"}' AS BLOB)
			WHERE event_type = 'OrderCreated.v1'`)
	}
	waitMetric("idemd_outbox_parked_total 1")
	waitMetric("idemd_outbox_parked_events 1")
	parked := "outbox WHERE parked_at IS NOT NULL"
	if kind == app.Postgres {
		parked = "outbox_pending WHERE parked_at IS NOT NULL"
	}
	if n := s.count(parked); n != 1 {
		t.Errorf("%d parked events in the outbox; want 1", n)
	}
	// Measured at start, then every 10 s.
	for _, g := range []string{app.ProjectionGroup, app.SagaGroup} {
		if m := metrics(); !strings.Contains(m, `idemd_kafka_consumer_lag{group="`+g+`"} `) {
			t.Errorf("no idemd_kafka_consumer_lag of group %s:\n%s", g, grepLines(m, "idemd_kafka"))
		}
	}
	// The runbook: fix the cause (the payload), unpark. The relay
	// publishes it, and the gauge falls; the counter stays.
	exec(`UPDATE outbox SET payload = (SELECT s.payload FROM saved_payload s WHERE s.id = outbox.id)
		WHERE id IN (SELECT id FROM saved_payload)`)
	if kind == app.Postgres {
		exec(`UPDATE outbox_pending SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
			WHERE id = (SELECT id FROM saved_payload)`)
	} else {
		exec(`UPDATE outbox SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
			WHERE id = (SELECT id FROM saved_payload)`)
	}
	s.waitCount(unpublished(kind), 0)
	waitMetric("idemd_outbox_parked_events 0")
	if !metric("idemd_outbox_parked_total 1") {
		t.Errorf("idemd_outbox_parked_total changed with the unpark:\n%s", grepLines(metrics(), "idemd_outbox"))
	}
}

// idemd_outbox_relay_active is exported from the start and turns 1 when
// the relay (here alone on its SQLite database) holds the relay lease.
func TestRelayLeaseGauge(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.SQLite)
	s := serveOn(t, dbArg, count)
	metrics := func() string { return string(s.do(http.MethodGet, "/metrics", "", "").body) }
	if m := metrics(); !strings.Contains(m, "\nidemd_outbox_relay_active ") {
		t.Fatalf("idemd_outbox_relay_active is not exported from the start:\n%s", grepLines(m, "idemd_outbox"))
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(metrics(), "\nidemd_outbox_relay_active 1\n"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the only relay does not report publishing:\n%s", grepLines(metrics(), "idemd_outbox"))
		}
	}
}
