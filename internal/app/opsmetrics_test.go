package app_test

import (
	"database/sql"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/app"
)

// An outbox event Kafka can never take (here one over the client's batch
// size) is parked: idemd_outbox_parked_total, exported at 0 from the
// start, counts it, and the gauge idemd_outbox_parked_events shows it
// parked until an operator unparks it (the runbook's idemd outbox
// unpark), then
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
		for deadline := time.Now().Add(60 * time.Second); !metric(line); time.Sleep(20 * time.Millisecond) {
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
	// The runbook: fix the cause (the payload), then idemd outbox unpark
	// -event with the event's ID. The relay publishes it, and the gauge
	// falls; the counter stays. The order's later events (its outcome)
	// were published before the park here, so none was held.
	exec(`UPDATE outbox SET payload = (SELECT s.payload FROM saved_payload s WHERE s.id = outbox.id)
		WHERE id IN (SELECT id FROM saved_payload)`)
	eventID := queryString(t, dbArg, `SELECT CAST(o.event_id AS text) FROM outbox o JOIN saved_payload s ON s.id = o.id`)
	unpark := func(args ...string) string {
		t.Helper()
		var stdout, stderr strings.Builder
		args = append([]string{"outbox", "unpark", "-db", dbArg}, args...)
		if code := app.Run(t.Context(), args, envOf(nil), &stdout, &stderr); code != 0 {
			t.Fatalf("idemd %v: exit %d, stderr %q", args, code, stderr.String())
		}
		return stdout.String()
	}
	// An event that is not parked (the order's other event, published) is
	// left as it is.
	other := queryString(t, dbArg, `SELECT CAST(event_id AS text) FROM outbox WHERE event_type <> 'OrderCreated.v1' LIMIT 1`)
	if out := unpark("-event", other); !strings.HasPrefix(out, "unparked 0 of the 1 events given ("+other+")") {
		t.Errorf("unpark of a published event: %q; want 0 unparked", out)
	}
	if out := unpark("-event", eventID); !strings.HasPrefix(out, "unparked 1 of the 1 events given ("+eventID+")") {
		t.Errorf("unpark: %q; want 1 unparked", out)
	}
	s.waitCount(unpublished(kind), 0)
	if out := unpark("-all"); !strings.HasPrefix(out, "unparked 0 parked events (all of them)") {
		t.Errorf("unpark -all with nothing parked: %q; want 0", out)
	}
	waitMetric("idemd_outbox_parked_events 0")
	if !metric("idemd_outbox_parked_total 1") {
		t.Errorf("idemd_outbox_parked_total changed with the unpark:\n%s", grepLines(metrics(), "idemd_outbox"))
	}
}

// queryString returns the one text value query selects on the database
// of dbArg, read as another process would (a connection of its own).
func queryString(t *testing.T, dbArg, query string) string {
	t.Helper()
	ctx := t.Context()
	var v string
	if path, ok := strings.CutPrefix(dbArg, "sqlite:"); ok {
		db, err := sql.Open("sqlite", sqlitedriver.DSN(path, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = db.Close() }()
		err = db.QueryRowContext(ctx, query).Scan(&v)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return v
	}
	pool, err := pgxpool.New(ctx, dbArg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.QueryRow(ctx, query).Scan(&v); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return v
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
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(metrics(), "\nidemd_outbox_relay_active 1\n"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the only relay does not report publishing:\n%s", grepLines(metrics(), "idemd_outbox"))
		}
	}
}
