package app_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/app"
)

// A projection partition stuck behind a lock a stuck transaction holds on
// the summary table (every try hits lock_timeout, a database fault: never
// dead-lettered) shows in idemd_kafka_consumer_stalled_seconds for the
// projection's consumer, growing, while the saga's stays 0; released, the
// partition moves on and the gauge falls back to 0.
func TestStalledProjectionExported(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.Postgres)
	u, err := url.Parse(dbArg)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("lock_timeout", "200") // ms, the role's setting a DBA would give it
	u.RawQuery = q.Encode()
	s := serveWith(t, u.String(), count, nil)
	metrics := func() string { return string(s.do(http.MethodGet, "/metrics", "", "").body) }
	stalled := func(consumer string) float64 {
		m := regexp.MustCompile(`(?m)^idemd_kafka_consumer_stalled_seconds\{consumer="` + consumer + `"\} (\S+)$`).FindStringSubmatch(metrics())
		if m == nil {
			t.Fatalf("no idemd_kafka_consumer_stalled_seconds for %s:\n%s", consumer, grepLines(metrics(), "idemd_kafka"))
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if p, sg := stalled(app.ProjectionInbox), stalled(app.SagaInbox); p != 0 || sg != 0 {
		t.Fatalf("stalled at start: projection %v, saga %v; want 0", p, sg)
	}

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbArg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `LOCK TABLE customer_order_summary IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	r := s.do(http.MethodPost, "/v1/orders", "stall-1", orderBody(7, "19.90"))
	if r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for stalled(app.ProjectionInbox) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the projection's partition never showed stalled:\n%s", grepLines(metrics(), "idemd_kafka"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sg := stalled(app.SagaInbox); sg != 0 {
		t.Errorf("saga consumer stalled %vs; want 0 (it does not touch the summary)", sg)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for stalled(app.ProjectionInbox) != 0 {
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatalf("the projection's partition still stalled after the lock went:\n%s", grepLines(metrics(), "idemd_kafka"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// idemd_kafka_consumer_offset_resets_total is exported for both consumers,
// at 0 while no partition lost records under them: an order goes through
// both without moving it. (It counts idemkafka.Consumer.OffsetResets,
// which idemkafka's tests drive with records deleted under a consumer.)
func TestOffsetResetsExported(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.SQLite)
	s := serveWith(t, dbArg, count, nil)
	metrics := func() string { return string(s.do(http.MethodGet, "/metrics", "", "").body) }
	resets := func(consumer string) float64 {
		m := regexp.MustCompile(`(?m)^idemd_kafka_consumer_offset_resets_total\{consumer="` + consumer + `"\} (\S+)$`).FindStringSubmatch(metrics())
		if m == nil {
			t.Fatalf("no idemd_kafka_consumer_offset_resets_total for %s:\n%s", consumer, grepLines(metrics(), "idemd_kafka"))
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	r := s.do(http.MethodPost, "/v1/orders", "resets-1", orderBody(3, "9.90"))
	if r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	waitMetric := time.Now().Add(30 * time.Second)
	for !regexp.MustCompile(`(?m)^idemd_inbox_events_total\{consumer="` + app.ProjectionInbox + `",result="applied"\} [1-9]`).MatchString(metrics()) {
		if time.Now().After(waitMetric) {
			t.Fatalf("the order's event never applied:\n%s", grepLines(metrics(), "idemd_inbox"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if p, sg := resets(app.ProjectionInbox), resets(app.SagaInbox); p != 0 || sg != 0 {
		t.Errorf("offset resets: projection %v, saga %v; want 0", p, sg)
	}
}
