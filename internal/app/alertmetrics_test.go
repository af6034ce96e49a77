package app_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/problem"
)

// The situations the runbook's alerts are for, driven on a running idemd
// (PostgreSQL, Kafka): each moves the series its alert reads, scraped
// from /metrics as Prometheus would.

// metricValue is the value of series (name{labels} as exposed) in a
// scrape, and whether it is there.
func metricValue(scrape, series string) (float64, bool) {
	for line := range strings.Lines(scrape) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

func (s *served) scrape() string {
	s.t.Helper()
	r := s.do(http.MethodGet, "/metrics", "", "")
	if r.status != http.StatusOK {
		s.t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	return string(r.body)
}

// metric is the value of series now; a series missing fails the test.
func (s *served) metric(series string) float64 {
	s.t.Helper()
	scrape := s.scrape()
	v, ok := metricValue(scrape, series)
	if !ok {
		s.t.Fatalf("/metrics has no %s:\n%s", series, grepLines(scrape, strings.SplitN(series, "{", 2)[0]))
	}
	return v
}

// waitMetric waits up to 30 s for series to reach at least want.
func (s *served) waitMetric(series string, want float64) {
	s.t.Helper()
	var scrape string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		scrape = s.scrape()
		if v, ok := metricValue(scrape, series); ok && v >= want {
			return
		}
	}
	s.t.Fatalf("no %s >= %v within 30 s:\n%s", series, want, grepLines(scrape, strings.SplitN(series, "{", 2)[0]))
}

// A record no consumer can apply (not an idem event: no headers) is
// dead-lettered by both consumers, and the "Dead letters" alert's series
// counts it.
func TestDeadLetterCounted(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	topic := kafkatest.Name("idemd-dead")
	cluster.CreateTopic(t, topic, 1)
	cluster.CreateTopic(t, topic+".dlq", 1)
	dbArg, count := dbCounter(t, app.Postgres)
	s := serveOn(t, dbArg, count, "-kafka", strings.Join(cluster.Seeds, ","), "-kafka-topic", topic)
	for _, c := range []string{app.ProjectionInbox, app.SagaInbox} {
		if v := s.metric(`idemd_inbox_events_total{consumer="` + c + `",result="dead_lettered"}`); v != 0 {
			t.Fatalf("%s: %v dead letters before any record", c, v)
		}
	}
	cluster.Produce(t, topic, &kgo.Record{Key: []byte("k"), Value: []byte("not an event")})
	for _, c := range []string{app.ProjectionInbox, app.SagaInbox} {
		s.waitMetric(`idemd_inbox_events_total{consumer="`+c+`",result="dead_lettered"}`, 1)
	}
	if n := len(cluster.Records(t, topic+".dlq")); n != 2 {
		t.Errorf("%d records in %s.dlq; want 2 (one per consumer)", n, topic)
	}
}

// A duplicate that waits for its key's first request longer than
// idemhttp's Config.Wait gets 409 request-in-progress: counted as the
// outcome in_progress and a 409 of its route. A command whose store
// fails (the session writing its record terminated, as a database
// restart does) gets 503 (outcome-unknown: the store cannot tell whether
// it committed): the outcome store_error the "Store unavailable" alert
// reads.
func TestConflictAndStoreErrorCounted(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.Postgres)
	s := serveOn(t, dbArg, count, "-kafka", "off")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbArg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	// The first request's handler waits for the orders table's lock.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `LOCK TABLE customer_order IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var first response
	wg.Go(func() { first = s.do(http.MethodPost, "/v1/orders", "held", orderBody(1, "5.00")) })
	waitFor(t, "the first request waits for the orders table", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'customer_order'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	dup := s.do(http.MethodPost, "/v1/orders", "held", orderBody(1, "5.00"))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if dup.status != http.StatusConflict || dup.problemType(t) != problem.TypeRequestInProgress {
		t.Errorf("duplicate: %d %s; want 409 request-in-progress", dup.status, dup.body)
	}
	if first.status != http.StatusCreated {
		t.Errorf("first: %d %s; want 201", first.status, first.body)
	}
	if v := s.metric(`idemd_http_outcomes_total{outcome="in_progress"}`); v != 1 {
		t.Errorf(`idemd_http_outcomes_total{outcome="in_progress"} = %v; want 1`, v)
	}
	if v := s.metric(`idemd_http_requests_total{route="POST /v1/orders",status="409"}`); v != 1 {
		t.Errorf(`idemd_http_requests_total{route="POST /v1/orders",status="409"} = %v; want 1`, v)
	}

	// The claim's session is terminated.
	for _, q := range []string{
		`CREATE FUNCTION kill_self() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$`,
		`CREATE TRIGGER kill_self BEFORE INSERT ON idempotency_record FOR EACH ROW EXECUTE FUNCTION kill_self()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	r := s.do(http.MethodPost, "/v1/payments", "killed", paymentBody("killed"))
	if typ := r.problemType(t); r.status != http.StatusServiceUnavailable ||
		typ != problem.TypeStoreUnavailable && typ != problem.TypeOutcomeUnknown {
		t.Errorf("POST with its record's session terminated: %d %s; want 503 store-unavailable or outcome-unknown", r.status, r.body)
	}
	if v := s.metric(`idemd_http_outcomes_total{outcome="store_error"}`); v != 1 {
		t.Errorf(`idemd_http_outcomes_total{outcome="store_error"} = %v; want 1`, v)
	}
	if v := s.metric(`idemd_http_requests_total{route="POST /v1/payments",status="503"}`); v != 1 {
		t.Errorf(`idemd_http_requests_total{route="POST /v1/payments",status="503"} = %v; want 1`, v)
	}
}

// A retention sweep that fails (its session terminated, as a database
// restart does) counts as failed: the "Retention sweep failed" alert's
// series; the sweeps before it as done.
func TestSweepFailureCounted(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.Postgres)
	s := serveOn(t, dbArg, count, "-kafka", "off", "-cleanup", "@every 1s")
	s.waitMetric(`idemd_cleanup_sweeps_total{result="done"}`, 1)
	if v := s.metric(`idemd_cleanup_sweeps_total{result="failed"}`); v != 0 {
		t.Fatalf("%v failed sweeps before any failure", v)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbArg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	for _, q := range []string{
		`CREATE FUNCTION kill_self() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$`,
		`CREATE TRIGGER kill_self BEFORE DELETE ON processed_event FOR EACH STATEMENT EXECUTE FUNCTION kill_self()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s.waitMetric(`idemd_cleanup_sweeps_total{result="failed"}`, 1)
}

// histogramQuantile is PromQL's histogram_quantile(q) of the series of
// name{labels} in a scrape (labels as exposed, without le): linear
// interpolation within the bucket holding the rank, the first bucket's
// lower bound 0.
func histogramQuantile(t *testing.T, scrape, name, labels string, q float64) float64 {
	t.Helper()
	type bucket struct{ le, count float64 }
	var buckets []bucket
	prefix := name + "_bucket{" + labels + `,le="`
	for line := range strings.Lines(scrape) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if !ok {
			continue
		}
		le, count, ok := strings.Cut(rest, `"} `)
		if !ok {
			t.Fatalf("bucket line %q", line)
		}
		b := bucket{}
		var err error
		if b.le, err = strconv.ParseFloat(le, 64); err != nil {
			t.Fatalf("bucket line %q: %v", line, err)
		}
		if b.count, err = strconv.ParseFloat(count, 64); err != nil {
			t.Fatalf("bucket line %q: %v", line, err)
		}
		buckets = append(buckets, b)
	}
	if len(buckets) < 2 {
		t.Fatalf("no buckets of %s{%s}:\n%s", name, labels, grepLines(scrape, name))
	}
	rank := q * buckets[len(buckets)-1].count
	lower, below := 0.0, 0.0
	for i, b := range buckets {
		if b.count >= rank {
			if i == len(buckets)-1 { // +Inf
				return buckets[i-1].le
			}
			return lower + (b.le-lower)*(rank-below)/(b.count-below)
		}
		lower, below = b.le, b.count
	}
	return buckets[len(buckets)-2].le
}

// The request duration histogram resolves what idemd answers in well
// under a millisecond: a replay from the replay cache. Its median as
// PromQL estimates it from the buckets is within what the mean allows
// (a median is at most twice the mean; a bucket at most 2.5 times its
// lower bound), or under 1 ms. With Prometheus' default buckets, whose
// first is 5 ms, every replay fell in the first bucket and the
// dashboard's p50 read 2.5 ms for replays served in about 0.1 ms (and
// commands' p50 on an idle database read the same).
func TestRequestDurationBucketsResolveReplays(t *testing.T) {
	t.Parallel()
	s := serve(t, app.SQLite, "-kafka", "off")
	if r := s.do(http.MethodPost, "/v1/payments", "replayed", paymentBody("replayed")); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	for range 100 {
		if r := s.do(http.MethodPost, "/v1/payments", "replayed", paymentBody("replayed")); r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d %v %s", r.status, r.header, r.body)
		}
	}
	scrape := s.scrape()
	route := `route="POST /v1/payments"`
	sum, _ := metricValue(scrape, `idemd_http_request_duration_seconds_sum{`+route+`}`)
	count, _ := metricValue(scrape, `idemd_http_request_duration_seconds_count{`+route+`}`)
	if count != 101 {
		t.Fatalf("idemd_http_request_duration_seconds_count{%s} = %v; want 101", route, count)
	}
	mean := sum / count
	p50 := histogramQuantile(t, scrape, "idemd_http_request_duration_seconds", route, 0.5)
	if p50 > 5*mean && p50 > 0.001 {
		t.Errorf("histogram_quantile(0.5) of %d replays = %.2f ms, their mean %.3f ms: the buckets do not resolve them:\n%s",
			int(count), p50*1000, mean*1000, grepLines(scrape, `idemd_http_request_duration_seconds_bucket{`+route))
	}
}
