package app_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// served is the app serving on a real listener (so the relay and the
// consumer run), with the embedded Kafka broker unless args say otherwise.
type served struct {
	t     *testing.T
	base  string
	count func(table string) int
}

func serve(t *testing.T, kind string, args ...string) *served {
	t.Helper()
	dbArg, count := dbCounter(t, kind)
	return serveOn(t, dbArg, count, args...)
}

// serveOn serves on the database of dbArg (replicas share one).
func serveOn(t *testing.T, dbArg string, count func(string) int, args ...string) *served {
	t.Helper()
	return serveWith(t, dbArg, count, nil, args...)
}

// serveWith is serveOn with options of app.New.
func serveWith(t *testing.T, dbArg string, count func(string) int, opts []app.Option, args ...string) *served {
	t.Helper()
	if !slices.Contains(args, "-kafka") {
		args = append(args, "-kafka-dir", t.TempDir())
	}
	cfg, err := app.ParseConfig(append([]string{"-db", dbArg, "-cleanup", "off"}, args...), envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(context.Background(), cfg, newTestLogger(io.Discard), opts...)
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		a.Close()
	})
	return &served{t: t, base: "http://" + ln.Addr().String(), count: count}
}

func (s *served) do(method, path, key, body string) response {
	s.t.Helper()
	req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func orderBody(customer int, amount string) string {
	return fmt.Sprintf(`{"customer_id":%d,"amount":%q,"items":[{"sku":"A-1","quantity":2}]}`, customer, amount)
}

// summaryCounts formats the counters of a summary as waitSummary compares
// them.
func summaryCounts(m map[string]any) string {
	return fmt.Sprintf("orders=%v pending=%v confirmed=%v rejected=%v total_amount=%v",
		m["orders"], m["pending"], m["confirmed"], m["rejected"], m["total_amount"])
}

// waitSummary polls the customer's summary until its counters are want
// (as summaryCounts formats them), for up to 60s (the projection is
// seconds behind on a loaded machine), and returns it.
func (s *served) waitSummary(customer int, want string) map[string]any {
	s.t.Helper()
	path := fmt.Sprintf("/v1/customers/%d/summary", customer)
	var last response
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last = s.do(http.MethodGet, path, "", "")
		if last.status == http.StatusOK {
			m := last.json(s.t)
			if p, _ := m["pending"].(float64); p < 0 {
				s.t.Fatalf("GET %s: negative pending: %s", path, last.body)
			}
			if summaryCounts(m) == want {
				return m
			}
		} else if last.status != http.StatusNotFound {
			s.t.Fatalf("GET %s: %d %s", path, last.status, last.body)
		}
	}
	s.t.Fatalf("GET %s: no summary with %s within 60s; last %d %s", path, want, last.status, last.body)
	return nil
}

// HTTP -> order + outbox -> relay -> embedded Kafka -> inbox -> projection.
func TestOrdersEndToEnd(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := serve(t, kind)
			if r := s.do(http.MethodGet, "/v1/customers/42/summary", "", ""); r.status != http.StatusNotFound || r.problemType(t) == "" {
				t.Errorf("summary before any order: %d %s", r.status, r.body)
			}
			created := s.do(http.MethodPost, "/v1/orders", "order-1", orderBody(42, "19.90"))
			if created.status != http.StatusCreated {
				t.Fatalf("POST: %d %s", created.status, created.body)
			}
			o := created.json(t)
			id, _ := o["id"].(string)
			if created.header.Get("Location") != "/v1/orders/"+id || o["amount"] != "19.9000" || o["status"] != "CREATED" ||
				o["customer_id"] != float64(42) || !strings.Contains(string(created.body), `"items":[{"sku":"A-1","quantity":2}]`) {
				t.Errorf("POST: %v %s", created.header, created.body)
			}
			replay := s.do(http.MethodPost, "/v1/orders", "order-1", orderBody(42, "19.90"))
			if replay.status != http.StatusCreated || string(replay.body) != string(created.body) || replay.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("replay: %d %v %s", replay.status, replay.header, replay.body)
			}
			if n := s.count("customer_order"); n != 1 {
				t.Errorf("%d orders, want 1", n)
			}
			// The order saga confirms the order: its PaymentCaptured.v1
			// is the second event of the outbox.
			got := s.waitStatus(id, "CONFIRMED")
			if got["amount"] != "19.9000" || got["created_at"] != o["created_at"] || got["payment_id"] == nil {
				t.Errorf("GET order: %v", got)
			}
			// OrderCreated.v1, PaymentCaptured.v1 and OrderConfirmed.v1
			// (emitted with the status).
			if n := s.count("outbox"); n != 3 {
				t.Errorf("%d outbox rows, want 3", n)
			}
			s.waitSummary(42, "orders=1 pending=0 confirmed=1 rejected=0 total_amount=19.9000")
			want := `{"customer_id":42,"orders":1,"pending":0,"confirmed":1,"rejected":0,"total_amount":"19.9000","last_order_id":"` + id + `"}` + "\n"
			if r := s.do(http.MethodGet, "/v1/customers/42/summary", "", ""); r.status != http.StatusOK || string(r.body) != want {
				t.Errorf("summary: %d %s, want %s", r.status, r.body, want)
			}
			// The consumer reports the applied events (OrderCreated.v1,
			// OrderConfirmed.v1, and PaymentCaptured.v1 as a no-op) once
			// its offsets are committed, just after the projection's
			// commit.
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				m := string(s.do(http.MethodGet, "/metrics", "", "").body)
				sagaApplied := `idemd_inbox_events_total{consumer="` + app.SagaInbox + `",result="applied"} `
				if strings.Contains(m, `idemd_inbox_events_total{consumer="`+app.ProjectionInbox+`",result="applied"} 3`+"\n") &&
					strings.Contains(m, sagaApplied) && !strings.Contains(m, sagaApplied+"0\n") && // the saga's consumer is counted too
					strings.Contains(m, "idemd_outbox_lag_seconds ") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("metrics lack the applied events or the lag:\n%s", grepLines(m, "idemd_"))
				}
			}
			if r := s.do(http.MethodGet, "/v1/orders/999999", "", ""); r.status != http.StatusNotFound {
				t.Errorf("GET missing order: %d", r.status)
			}
		})
	}
}

// Twenty orders of two customers posted at once: the summaries add up
// exactly.
func TestOrdersConcurrentSummaries(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := serve(t, kind)
			const n = 20
			totals := map[int]decimal.Decimal{}
			var wg sync.WaitGroup
			for i := range n {
				customer := 7 + i%2
				amount := fmt.Sprintf("%d.%04d", i+1, 37*i+1)
				totals[customer] = totals[customer].Add(decimal.RequireFromString(amount))
				wg.Go(func() {
					r := s.do(http.MethodPost, "/v1/orders", fmt.Sprintf("k-%d", i), orderBody(customer, amount))
					if r.status != http.StatusCreated {
						t.Errorf("POST %d: %d %s", i, r.status, r.body)
					}
				})
			}
			wg.Wait()
			for customer, total := range totals {
				s.waitSummary(customer, fmt.Sprintf("orders=%d pending=0 confirmed=%d rejected=0 total_amount=%s", n/2, n/2, total.StringFixed(4)))
			}
			// Each consumer applies the n OrderCreated.v1, and the n
			// PaymentCaptured.v1 and n OrderConfirmed.v1 of the saga once.
			s.waitCount(consumerEvents(app.ProjectionInbox), 3*n)
			s.waitCount(consumerEvents(app.SagaInbox), 3*n)
			s.waitCount("payment WHERE payment_provider = 'idemd-saga'", n)
		})
	}
}

// With -kafka off, orders are stored and their events wait in the outbox;
// the summary answers 503.
func TestOrdersKafkaOff(t *testing.T) {
	t.Parallel()
	s := serve(t, app.SQLite, "-kafka", "off")
	if r := s.do(http.MethodPost, "/v1/orders", "k", orderBody(1, "5")); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	r := s.do(http.MethodGet, "/v1/customers/1/summary", "", "")
	if r.status != http.StatusServiceUnavailable || r.problemType(t) == "" || !strings.Contains(string(r.body), "off") {
		t.Errorf("summary: %d %s", r.status, r.body)
	}
	if n := s.count("outbox"); n != 1 {
		t.Errorf("%d outbox rows, want 1", n)
	}
}

func TestOrdersBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, app.SQLite)
	tests := []struct {
		name, key, body string
		status          int
		mention         string
	}{
		{"no key", "", orderBody(1, "1"), http.StatusBadRequest, "Idempotency-Key"},
		{"unknown field", "k1", `{"customer_id":1,"amount":"1","items":[{"sku":"a","quantity":1}],"coupon":"x"}`, http.StatusBadRequest, "coupon"},
		{"unknown item field", "k2", `{"customer_id":1,"amount":"1","items":[{"sku":"a","quantity":1,"price":1}]}`, http.StatusBadRequest, "price"},
		{"amount number", "k3", `{"customer_id":1,"amount":1.5,"items":[{"sku":"a","quantity":1}]}`, http.StatusUnprocessableEntity, "amount"},
		{"no items", "k4", `{"customer_id":1,"amount":"1","items":[]}`, http.StatusUnprocessableEntity, "items"},
		{"bad quantity", "k5", `{"customer_id":1,"amount":"1","items":[{"sku":"a","quantity":1001}]}`, http.StatusUnprocessableEntity, "items[0].quantity"},
	}
	for _, tt := range tests {
		r := e.do(http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": tt.key}, tt.body)
		if tt.key == "" {
			r = e.do(http.MethodPost, "/v1/orders", nil, tt.body)
		}
		if r.status != tt.status || r.problemType(t) == "" || !strings.Contains(string(r.body), tt.mention) {
			t.Errorf("%s: %d %s, want %d mentioning %s", tt.name, r.status, r.body, tt.status, tt.mention)
		}
	}
}

// Two replicas on one PostgreSQL and one Kafka cluster (kfake, or the real
// one of IDEM_TEST_KAFKA_SEEDS): orders posted to either are projected
// exactly once, whichever replica's relay publishes them and whichever
// replica's consumer owns their partition.
func TestOrdersReplicas(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	topic := kafkatest.Name("idemd-orders")
	cluster.CreateTopic(t, topic, 3)
	cluster.CreateTopic(t, topic+".dlq", 1)
	dbArg, count := dbCounter(t, app.Postgres)
	args := []string{"-kafka", strings.Join(cluster.Seeds, ","), "-kafka-topic", topic}
	replicas := []*served{serveOn(t, dbArg, count, args...), serveOn(t, dbArg, count, args...)}
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := replicas[i%2].do(http.MethodPost, "/v1/orders", fmt.Sprintf("k-%d", i), orderBody(5, "0.5"))
			if r.status != http.StatusCreated {
				t.Errorf("POST %d: %d %s", i, r.status, r.body)
			}
		})
	}
	wg.Wait()
	for _, r := range replicas {
		r.waitSummary(5, fmt.Sprintf("orders=%d pending=0 confirmed=%d rejected=0 total_amount=10.0000", n, n))
	}
	replicas[0].waitCount(consumerEvents(app.ProjectionInbox), 3*n)
	replicas[0].waitCount(consumerEvents(app.SagaInbox), 3*n)
	replicas[0].waitCount("customer_order WHERE status = 'CONFIRMED'", n)
	replicas[0].waitCount("payment", n)
}

// Static membership (-kafka-instance-id). Two replicas given one instance
// ID by mistake: the second to start takes the partitions, and the first
// stops with an error naming the mistake instead of taking them back (which
// would go on for ever, both replicas in turn). The replica left keeps
// projecting orders.
func TestKafkaInstanceIDShared(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	topic := kafkatest.Name("idemd-static")
	cluster.CreateTopic(t, topic, 3)
	cluster.CreateTopic(t, topic+".dlq", 1)
	dbArg, count := dbCounter(t, app.Postgres)
	var logs testlog.Buffer
	one, done := startServing(t, dbArg, count, &logs, "-kafka", strings.Join(cluster.Seeds, ","),
		"-kafka-topic", topic, "-kafka-instance-id", "idemd-0")
	if r := one.do(http.MethodPost, "/v1/orders", "k-1", orderBody(7, "1")); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	one.waitSummary(7, "orders=1 pending=0 confirmed=1 rejected=0 total_amount=1.0000")
	if !strings.Contains(logs.String(), `"instance_id":"idemd-0"`) {
		t.Errorf("the consumers' start-up lines do not name the instance ID; logs:\n%s", logs.String())
	}

	two := serveOn(t, dbArg, count, "-kafka", strings.Join(cluster.Seeds, ","), "-kafka-topic", topic, "-kafka-instance-id", "idemd-0")
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "instance ID") {
			t.Fatalf("the fenced replica's Serve = %v; want an error about its instance ID", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first replica still runs after a second one joined with its instance ID")
	}
	if r := two.do(http.MethodPost, "/v1/orders", "k-2", orderBody(7, "2")); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	two.waitSummary(7, "orders=2 pending=0 confirmed=2 rejected=0 total_amount=3.0000")
}

// -kafka-session-timeout reaches the consumers: the embedded broker takes
// any value idemd accepts, and a cluster whose group.max.session.timeout.ms
// is lower refuses it, which stops idemd with an error naming it, instead
// of consumers that never join.
func TestKafkaSessionTimeout(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		s := serve(t, app.SQLite, "-kafka-session-timeout", "20m")
		if r := s.do(http.MethodPost, "/v1/orders", "k-1", orderBody(3, "1")); r.status != http.StatusCreated {
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
		s.waitSummary(3, "orders=1 pending=0 confirmed=1 rejected=0 total_amount=1.0000")
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		cluster := kafkatest.New(t, kfake.GroupMaxSessionTimeout(time.Minute))
		if cluster.Real() {
			t.Skip("the refusal needs a broker whose group.max.session.timeout.ms is 1 minute")
		}
		topic := kafkatest.Name("idemd-session")
		cluster.CreateTopic(t, topic, 1)
		cluster.CreateTopic(t, topic+".dlq", 1)
		dbArg, count := dbCounter(t, app.SQLite)
		_, done := startServing(t, dbArg, count, io.Discard, "-kafka", strings.Join(cluster.Seeds, ","),
			"-kafka-topic", topic, "-kafka-session-timeout", "2m")
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "refuses the session timeout 2m0s") {
				t.Fatalf("Serve = %v; want an error naming the refused session timeout", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("idemd still serves with a session timeout the brokers refuse")
		}
	})
	// Brokers that say their range (DescribeConfigs) refuse a session
	// timeout outside it at start-up, before idemd serves anything, with
	// the range in the message.
	for _, tc := range []struct {
		name, timeout string
		brokerCfg     map[string]string
		want          []string
	}{
		{"above the maximum", "2m", map[string]string{"group.max.session.timeout.ms": "60000"},
			[]string{"-kafka-session-timeout 2m0s", "from 6s to 1m0s", "group.max.session.timeout.ms"}},
		{"below the minimum", "2s", nil,
			[]string{"-kafka-session-timeout 2s", "from 6s to 5m0s", "group.min.session.timeout.ms"}},
	} {
		t.Run("refused at start-up/"+tc.name, func(t *testing.T) {
			t.Parallel()
			cluster := kafkatest.New(t, kfake.BrokerConfigs(tc.brokerCfg))
			if cluster.Real() {
				t.Skip("needs a broker with known group.min/max.session.timeout.ms")
			}
			topic := kafkatest.Name("idemd-session")
			cluster.CreateTopic(t, topic, 1)
			cluster.CreateTopic(t, topic+".dlq", 1)
			dbArg, _ := dbCounter(t, app.SQLite)
			cfg, err := app.ParseConfig([]string{"-db", dbArg, "-cleanup", "off", "-kafka", strings.Join(cluster.Seeds, ","),
				"-kafka-topic", topic, "-kafka-session-timeout", tc.timeout}, envOf(nil))
			if err != nil {
				t.Fatal(err)
			}
			a, err := app.New(t.Context(), cfg, newTestLogger(io.Discard))
			if err == nil {
				a.Close()
				t.Fatalf("app.New with -kafka-session-timeout %s succeeded; want it refused", tc.timeout)
			}
			var ce *app.ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("error %v (%T); want a *app.ConfigError (exit 2 at start-up)", err, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q; want it to contain %q", err, w)
				}
			}
		})
	}
}

// startServing runs idemd on the database of dbArg with args (after -db and
// -cleanup off), logging to logs, until the test ends; done receives
// Serve's result.
func startServing(t *testing.T, dbArg string, count func(string) int, logs io.Writer, args ...string) (s *served, done <-chan error) {
	t.Helper()
	cfg, err := app.ParseConfig(append([]string{"-db", dbArg, "-cleanup", "off"}, args...), envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(t.Context(), cfg, newTestLogger(logs))
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	t.Cleanup(a.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() { result <- a.Serve(ctx, ln) }()
	t.Cleanup(cancel)
	return &served{t: t, base: "http://" + ln.Addr().String(), count: count}, result
}
