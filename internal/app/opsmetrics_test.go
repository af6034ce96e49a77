package app_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
)

// An outbox event Kafka can never take (here one over the client's batch
// size) is parked, and idemd_outbox_parked_total, exported at 0 from the
// start, counts it; the consumer groups' lag is exported too.
func TestParkedEventCounted(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.SQLite)
	exec := dbExecer(t, dbArg)
	s := serveOn(t, dbArg, count)
	metric := func(line string) bool {
		return strings.Contains(string(s.do(http.MethodGet, "/metrics", "", "").body), "\n"+line+"\n")
	}
	if !metric("idemd_outbox_parked_total 0") {
		t.Errorf("idemd_outbox_parked_total is not exported at 0 from the start")
	}
	r := s.do(http.MethodPost, "/v1/orders", "poison", orderBody(42, "19.90"))
	if r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	id, _ := r.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")
	s.waitCount(unpublished(app.SQLite), 0)
	// Its OrderCreated.v1 event to be published again, now 1.6 MB: over
	// the producer's batch size, poison.
	exec(`UPDATE outbox SET published_at = NULL, payload = CAST('{"pad":"' || hex(randomblob(800000)) || '"}' AS BLOB)
		WHERE event_type = 'OrderCreated.v1'`)
	for deadline := time.Now().Add(10 * time.Second); !metric("idemd_outbox_parked_total 1"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no parked event counted:\n%s", grepLines(string(s.do(http.MethodGet, "/metrics", "", "").body), "idemd_outbox"))
		}
	}
	if n := s.count("outbox WHERE parked_at IS NOT NULL"); n != 1 {
		t.Errorf("%d parked events in the outbox; want 1", n)
	}
	// Measured at start, then every 10 s.
	for _, g := range []string{app.ProjectionGroup, app.SagaGroup} {
		if m := string(s.do(http.MethodGet, "/metrics", "", "").body); !strings.Contains(m, `idemd_kafka_consumer_lag{group="`+g+`"} `) {
			t.Errorf("no idemd_kafka_consumer_lag of group %s:\n%s", g, grepLines(m, "idemd_kafka"))
		}
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
