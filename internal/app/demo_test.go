package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/problem"
)

// demoTarget runs an idemd on SQLite with the embedded broker until the
// test ends, and returns it with its base URL and its broker's address.
func demoTarget(t *testing.T, extra ...string) (a *App, url, kafka string) {
	t.Helper()
	dir := t.TempDir()
	cfg, err := ParseConfig(append([]string{"-db", "sqlite:" + filepath.Join(dir, "idemd.db"), "-cleanup", "off",
		"-kafka-dir", filepath.Join(dir, "kafka")}, extra...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	a, err = New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("New: %v", err)
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
	// "embedded (127.0.0.1:PORT, log DIR)"
	kafka, _, _ = strings.Cut(strings.TrimPrefix(a.Kafka(), KafkaEmbedded+" ("), ",")
	if _, _, err := net.SplitHostPort(kafka); err != nil {
		t.Fatalf("no broker address in %q", a.Kafka())
	}
	return a, "http://" + ln.Addr().String(), kafka
}

// demoRows parses the table of a report: row name -> its 6 cells.
func demoRows(t *testing.T, out string) map[string][]string {
	t.Helper()
	rows := map[string][]string{}
	re := regexp.MustCompile(`(?m)^(orders|payments|saga charges|order outcomes|projection|kafka events)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$`)
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		rows[m[1]] = m[2:]
	}
	return rows
}

// demoCell returns a numeric cell (0 sent, 1 distinct, 2 held, 3 double
// effects, 4 lost, 5 refused).
func demoCell(t *testing.T, rows map[string][]string, row string, i int) int {
	t.Helper()
	cells, ok := rows[row]
	if !ok {
		t.Fatalf("no row %q", row)
	}
	n, err := strconv.Atoi(cells[i])
	if err != nil {
		t.Fatalf("row %q cell %d: %q is not a number", row, i, cells[i])
	}
	return n
}

// The demo's faults (lost responses, concurrent duplicates, payments under
// a new key, Kafka records produced again) leave no double effect and lose
// nothing, with the broker found through GET /v1/kafka; a second run on the
// same idemd (without step 3) is told apart from the first.
func TestDemo(t *testing.T) {
	t.Parallel()
	_, url, _ := demoTarget(t)
	var stdout, stderr bytes.Buffer
	// No -kafka: the demo asks idemd where its (embedded) broker is.
	code := Run(context.Background(), []string{"demo", "-url", url, "-orders", "10", "-seed", "1"},
		func(string) string { return "" }, &stdout, &stderr)
	out := stdout.String()
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr.String())
	}
	t.Logf("\n%s", out)
	rows := demoRows(t, out)
	// Order 7 is over the payment limit: REJECTED, not charged.
	for _, c := range []struct {
		row              string
		distinct, double int
	}{
		{"orders", 10, 0},
		{"saga charges", 9, 0},
		{"order outcomes", 10, -1},
		{"projection", 20, 0},   // 10 orders + 10 outcomes
		{"kafka events", 29, 0}, // 9 confirmed x 3 events + 1 rejected x 2
	} {
		if got := demoCell(t, rows, c.row, 1); got != c.distinct {
			t.Errorf("%s: distinct %d, want %d", c.row, got, c.distinct)
		}
		if got := demoCell(t, rows, c.row, 2); got != c.distinct {
			t.Errorf("%s: held %d, want %d", c.row, got, c.distinct)
		}
		if c.double == 0 {
			if got := demoCell(t, rows, c.row, 3); got != 0 {
				t.Errorf("%s: %d double effects", c.row, got)
			}
		}
		if got := demoCell(t, rows, c.row, 4); got != 0 {
			t.Errorf("%s: %d lost", c.row, got)
		}
	}
	if p := demoCell(t, rows, "payments", 1); p == 0 || demoCell(t, rows, "payments", 2) != p ||
		demoCell(t, rows, "payments", 3) != 0 || demoCell(t, rows, "payments", 4) != 0 {
		t.Errorf("payments: %v, want distinct = held > 0 and no double effect, nothing lost", rows["payments"])
	}
	// Retries and duplicates: more requests than operations.
	if sent := demoCell(t, rows, "orders", 0); sent <= 10 {
		t.Errorf("orders: %d requests sent for 10 orders, want more (retries, duplicates)", sent)
	}
	if sent := demoCell(t, rows, "kafka events", 0); sent < 2*29 {
		t.Errorf("kafka events: %d records produced again, want at least %d", sent, 2*29)
	}
	for _, want := range []string{"OK: no double effects, nothing lost", "order-projection dropped"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the report", want)
		}
	}

	stdout.Reset()
	code = runDemo(context.Background(), []string{"-url", url, "-orders", "3", "-reproduce=false"}, func(string) string { return "" }, nil, &stdout, &stderr)
	if out := stdout.String(); code != 0 || !strings.Contains(out, "kafka events     skipped: -reproduce=false") {
		t.Fatalf("second run with -reproduce=false: exit %d\n%s", code, out)
	}
	if rows := demoRows(t, stdout.String()); demoCell(t, rows, "orders", 2) != 3 || demoCell(t, rows, "projection", 1) != 6 {
		t.Errorf("second run: %v, want 3 orders held and 6 projection counts", rows)
	}
}

// An idemd that forgets Idempotency-Keys (here, a proxy giving every order
// request a new one) executes retries and duplicates again: the demo
// reports the double effects and exits 1.
func TestDemoForgetfulServer(t *testing.T) {
	t.Parallel()
	a, _, _ := demoTarget(t)
	forgetful := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/orders" {
			key, err := idemclient.NewKey()
			if err != nil {
				t.Error(err)
			}
			r.Header.Set(idemclient.HeaderKey, key)
		}
		a.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(forgetful.Close)
	var stdout, stderr bytes.Buffer
	code := runDemo(context.Background(), []string{"-url", forgetful.URL, "-orders", "4", "-seed", "1"},
		func(string) string { return "" }, nil, &stdout, &stderr)
	out := stdout.String()
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s\n%s", code, out, stderr.String())
	}
	if d := demoCell(t, demoRows(t, out), "orders", 3); d == 0 || !strings.Contains(out, "FAILED") {
		t.Errorf("orders: %d double effects, want some, and FAILED\n%s", d, out)
	}
}

// -timeout bounds the wait for idemd to settle, not the whole run: a demo
// whose orders take longer than -timeout to send (a slow idemd, a database
// restarting under it) still waits for the sagas, reproduces the Kafka
// records and passes, instead of finding its deadline gone and reporting
// Kafka unreachable.
func TestDemoTimeoutStartsAfterSending(t *testing.T) {
	t.Parallel()
	a, _, _ := demoTarget(t)
	// -timeout 10s: the settling, Kafka's records produced again and
	// read, and the projection take well under a second on a quiet
	// machine, seconds on a loaded one (-timeout 3s was tight).
	const delay, timeout = 3 * time.Second, 10 * time.Second
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/orders" {
			time.Sleep(delay)
		}
		a.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)
	var stdout, stderr bytes.Buffer
	start := time.Now()
	// 4 orders one at a time: at least 12 s of sending, more than -timeout.
	code := runDemo(context.Background(), []string{"-url", slow.URL, "-orders", "4", "-concurrency", "1", "-seed", "1", "-timeout", timeout.String()},
		func(string) string { return "" }, nil, &stdout, &stderr)
	out := stdout.String()
	if took := time.Since(start); took < 4*delay {
		t.Fatalf("the demo took %v: the orders were not sent slowly enough to outlast -timeout", took)
	}
	if code != 0 || !strings.Contains(out, "OK: no double effects, nothing lost") {
		t.Fatalf("exit %d, want 0 and OK\n%s\n%s", code, out, stderr.String())
	}
}

// Flags: -h is the usage, bad values are exit 2, defaults come from idemd's
// environment variables.
func TestDemoFlags(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := runDemo(context.Background(), []string{"-h"}, func(string) string { return "" }, nil, &stdout, &stderr); code != 0 ||
		!strings.HasPrefix(stdout.String(), "usage: idemd demo") {
		t.Errorf("-h: exit %d, %q", code, stdout.String())
	}
	for _, args := range [][]string{{"-orders", "0"}, {"-attempts", "0"}, {"-kafka", "off"}, {"-url", "localhost:8080"}, {"extra"},
		{"-kafka-sasl", "gssapi"}, {"-kafka-sasl", "plain", "-kafka-sasl-user", "u"}, {"-kafka-tls-cert", "c.pem"}} {
		if code := runDemo(context.Background(), args, func(string) string { return "" }, nil, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	env := map[string]string{"IDEMD_ADDR": "0.0.0.0:9000", "IDEMD_KAFKA": "embedded", "IDEMD_KAFKA_EMBEDDED_ADDR": "127.0.0.1:9092"}
	cfg, err := parseDemo(nil, func(k string) string { return env[k] })
	if err != nil || cfg.url != "http://127.0.0.1:9000" || cfg.kafka != "127.0.0.1:9092" || cfg.orders != DefaultDemoOrders {
		t.Errorf("defaults from the environment: %+v, %v", cfg, err)
	}
	cfg, err = parseDemo(nil, func(string) string { return "" })
	if err != nil || cfg.url != "http://"+DefaultAddr || cfg.kafka != "" || cfg.topic != DefaultKafkaTopic {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
}

// The demo reads the events of an idemd that writes CloudEvents headers
// only (-kafka-headers cloudevents) as well as idem's.
func TestDemoCloudEventsHeaders(t *testing.T) {
	t.Parallel()
	_, url, _ := demoTarget(t, "-kafka-headers", "cloudevents")
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), []string{"demo", "-url", url, "-orders", "5", "-seed", "2"},
		func(string) string { return "" }, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "OK: no double effects, nothing lost") {
		t.Fatalf("demo against -kafka-headers cloudevents: exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
}

// refusingProxy serves a's API, but answers the POSTs to path whose
// Idempotency-Key refuse picks (by the order the keys were first seen) as
// idemhttp does with its database down: 503 store-unavailable, "the
// command was not executed". With execute, the request reaches idemd all
// the same (and its answer is thrown away): a server that lies.
func refusingProxy(t *testing.T, a *App, path string, refuse func(i int) bool, execute bool) *httptest.Server {
	t.Helper()
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == path {
			key := r.Header.Get(idemclient.HeaderKey)
			mu.Lock()
			i, ok := seen[key]
			if !ok {
				i = len(seen)
				seen[key] = i
			}
			mu.Unlock()
			if refuse(i) {
				if execute {
					a.Handler().ServeHTTP(httptest.NewRecorder(), r)
				}
				w.Header().Set("Retry-After", "1")
				problem.WriteError(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable,
					"Idempotency store unavailable", "The command was not executed. Retry with the same key.")
				return
			}
		}
		a.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Operations answered 503 store-unavailable ("not executed") on every
// attempt (idemd's database down for longer than the client's retries)
// are reported as refused, not lost: the demo passes.
func TestDemoRefusedNotLost(t *testing.T) {
	t.Parallel()
	a, _, _ := demoTarget(t)
	orders := refusingProxy(t, a, "/v1/orders", func(i int) bool { return i%3 == 2 }, false)
	// And the first payment, through a second proxy in front of the first.
	pays := refusingProxy(t, a, "/v1/payments", func(i int) bool { return i == 0 }, false)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/payments" {
			pays.Config.Handler.ServeHTTP(w, r)
			return
		}
		orders.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	var stdout, stderr bytes.Buffer
	code := runDemo(context.Background(), []string{"-url", front.URL, "-orders", "6", "-seed", "1", "-concurrency", "1",
		"-attempts", "2", "-reproduce=false"}, func(string) string { return "" }, nil, &stdout, &stderr)
	out := stdout.String()
	t.Logf("\n%s", out)
	if code != 0 || !strings.Contains(out, "OK: no double effects, nothing lost") {
		t.Fatalf("exit %d, want 0 and OK\n%s", code, stderr.String())
	}
	rows := demoRows(t, out)
	if d, h, l, r := demoCell(t, rows, "orders", 1), demoCell(t, rows, "orders", 2), demoCell(t, rows, "orders", 4),
		demoCell(t, rows, "orders", 5); d != 6 || h != 4 || l != 0 || r != 2 {
		t.Errorf("orders: distinct %d held %d lost %d refused %d, want 6 4 0 2", d, h, l, r)
	}
	if l, r := demoCell(t, rows, "payments", 4), demoCell(t, rows, "payments", 5); l != 0 || r != 1 {
		t.Errorf("payments: lost %d refused %d, want 0 and 1", l, r)
	}
	if !strings.Contains(out, "refused: 2 order operations and 1 payment operation answered 503 store-unavailable") {
		t.Errorf("no line about the refused operations")
	}
}

// A server that answers "not executed" for a command it executed is
// caught: the order it created was never answered to a client.
func TestDemoRefusedButExecuted(t *testing.T) {
	t.Parallel()
	a, _, _ := demoTarget(t)
	liar := refusingProxy(t, a, "/v1/orders", func(i int) bool { return i == 2 }, true)
	var stdout, stderr bytes.Buffer
	code := runDemo(context.Background(), []string{"-url", liar.URL, "-orders", "4", "-seed", "1", "-concurrency", "1",
		"-attempts", "2", "-reproduce=false"}, func(string) string { return "" }, nil, &stdout, &stderr)
	out := stdout.String()
	if code != 1 || !strings.Contains(out, "FAILED") || !strings.Contains(out, "was never answered to a client") {
		t.Fatalf("exit %d, want 1, FAILED and the order never answered\n%s\n%s", code, out, stderr.String())
	}
	if d := demoCell(t, demoRows(t, out), "orders", 3); d != 1 {
		t.Errorf("orders: %d double effects, want 1\n%s", d, out)
	}
}

// A run whose every order was refused showed nothing: it fails, saying so.
func TestDemoAllRefused(t *testing.T) {
	t.Parallel()
	a, _, _ := demoTarget(t)
	down := refusingProxy(t, a, "/v1/orders", func(int) bool { return true }, false)
	var stdout, stderr bytes.Buffer
	code := runDemo(context.Background(), []string{"-url", down.URL, "-orders", "2", "-attempts", "1", "-reproduce=false"},
		func(string) string { return "" }, nil, &stdout, &stderr)
	out := stdout.String()
	if code != 1 || !strings.Contains(out, "every order operation was refused") {
		t.Fatalf("exit %d, want 1 and every order refused\n%s\n%s", code, out, stderr.String())
	}
	if r := demoCell(t, demoRows(t, out), "orders", 5); r != 2 {
		t.Errorf("orders: %d refused, want 2", r)
	}
}

// An idemd whose /healthz answers 503 with Retry-After: 5 (its database
// down) is reported as such, not as an idemd that does not answer: the
// client stops at a Retry-After past its deadline with a
// *idemclient.RetryAfterError, which is an answer all the same.
func TestDemoUnhealthy(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "database unavailable", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := runDemo(context.Background(), []string{"-url", srv.URL, "-orders", "1", "-seed", "1"},
		func(string) string { return "" }, nil, &stdout, &stderr)
	if took := time.Since(start); code == 0 || took > 30*time.Second ||
		!strings.Contains(stderr.String()+stdout.String(), "GET /healthz answered 503") {
		t.Fatalf("exit %d after %v, want an error naming the 503 at once\n%s\n%s", code, took, stdout.String(), stderr.String())
	}
}

// An idemd restarted while the demo runs (killed and started again, as
// the README's "Restarting" describes) comes back with its embedded broker
// on another free port: the demo asks GET /v1/kafka again before step 3,
// instead of reporting Kafka unreachable at the address the first idemd
// had. Here /v1/kafka first names a port nobody listens on, then the
// broker's.
func TestDemoKafkaMovedWhileRunning(t *testing.T) {
	t.Parallel()
	a, _, _ := demoTarget(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	var asked sync.Mutex
	first := true
	restarted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/kafka" {
			asked.Lock()
			old := first
			first = false
			asked.Unlock()
			if old {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"mode":"embedded","seeds":["`+gone+`"],"topic":"idemd.orders"}`)
				return
			}
		}
		a.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(restarted.Close)
	var stdout, stderr bytes.Buffer
	code := runDemo(context.Background(), []string{"-url", restarted.URL, "-orders", "4", "-seed", "1"},
		func(string) string { return "" }, nil, &stdout, &stderr)
	out := stdout.String()
	if code != 0 || !strings.Contains(out, "OK: no double effects, nothing lost") {
		t.Fatalf("exit %d, want 0 and OK\n%s\n%s", code, out, stderr.String())
	}
	if sent := demoCell(t, demoRows(t, out), "kafka events", 0); sent == 0 {
		t.Errorf("kafka events: no record produced again\n%s", out)
	}
}

// The responses the demo loses on purpose are never an operation's last
// attempt's: with one attempt per request, no response is lost, and the
// run passes. (Losing the answer of the one attempt that got through,
// after the others met an idemd restarting, failed the run for a fault
// of the demo's own making.)
func TestDemoKeepsTheLastAttemptsAnswer(t *testing.T) {
	t.Parallel()
	a, _, _ := demoTarget(t)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	var stdout, stderr bytes.Buffer
	code := runDemo(context.Background(), []string{"-url", srv.URL, "-orders", "6", "-seed", "1", "-concurrency", "1",
		"-attempts", "1", "-reproduce=false"}, func(string) string { return "" }, nil, &stdout, &stderr)
	out := stdout.String()
	if code != 0 || !strings.Contains(out, "OK: no double effects, nothing lost") {
		t.Fatalf("exit %d, want 0 and OK\n%s\n%s", code, out, stderr.String())
	}
}

// demoAmountRe finds the "amount" of JSON bodies, which demoAddCent raises
// by a cent: the money a server
// with a rounding or a parsing bug would hold.
var demoAmountRe = regexp.MustCompile(`"amount":"([0-9.]+)"`)

func demoAddCent(b []byte) []byte {
	return demoAmountRe.ReplaceAllFunc(b, func(m []byte) []byte {
		d := decimal.RequireFromString(string(demoAmountRe.FindSubmatch(m)[1]))
		return fmt.Appendf(nil, `"amount":%q`, d.Add(decimal.New(1, -2)).StringFixed(4))
	})
}

// A server that holds other amounts than the clients sent (here, a proxy
// adding a cent to every order and payment it forwards; the saga charges,
// the summaries and the payments agree with the orders held) makes no
// double effect and loses nothing, but it is wrong about money: the demo
// compares what it holds with what was sent, and with the totals, and
// fails. So does a saga charge of another amount than its order.
func TestDemoChecksMoney(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// post rewrites a POST's body, get a GET's answer.
		post, get func(path string, b []byte) []byte
		want      []string
	}{
		{
			name: "amounts sent",
			post: func(_ string, b []byte) []byte { return demoAddCent(b) },
			want: []string{"holds amount", "the client sent", "as sent and to"},
		},
		{
			name: "charge",
			get: func(path string, b []byte) []byte {
				if strings.HasPrefix(path, "/v1/payments/") && bytes.Contains(b, []byte(`"provider":"`+orders.SagaProvider+`"`)) {
					return demoAddCent(b)
				}
				return b
			},
			want: []string{"was charged", "money: the orders to confirm amount to"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a, _, _ := demoTarget(t)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost && c.post != nil {
					b, err := io.ReadAll(r.Body)
					if err != nil {
						t.Error(err)
					}
					b = c.post(r.URL.Path, b)
					r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
				}
				if r.Method == http.MethodGet && c.get != nil {
					rec := httptest.NewRecorder()
					a.Handler().ServeHTTP(rec, r)
					b := c.get(r.URL.Path, rec.Body.Bytes())
					for k, v := range rec.Header() {
						w.Header()[k] = v
					}
					w.Header().Del("Content-Length")
					w.WriteHeader(rec.Code)
					_, _ = w.Write(b)
					return
				}
				a.Handler().ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			var stdout, stderr bytes.Buffer
			code := runDemo(context.Background(), []string{"-url", srv.URL, "-orders", "4", "-seed", "1", "-reproduce=false"},
				func(string) string { return "" }, nil, &stdout, &stderr)
			out := stdout.String()
			t.Logf("\n%s", out)
			if code != 1 || !strings.Contains(out, "FAILED") {
				t.Fatalf("exit %d, want 1 and FAILED\n%s\n%s", code, out, stderr.String())
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("no %q in the report\n%s", w, out)
				}
			}
		})
	}
}

// A password in -url (user info, for a proxy with HTTP Basic in front of
// idemd) is never printed: not in the log line while waiting, not in the
// error, not in a malformed URL's error, nor in a refused -url's.
func TestDemoURLPasswordNotShown(t *testing.T) {
	t.Parallel()
	const secret = "Zq9SecretPW"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "database unavailable", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	for _, url := range []string{
		strings.Replace(srv.URL, "http://", "http://user:"+secret+"@", 1), // 503 at once
		"http://user:" + secret + "@127.0.0.1:1",                          // waits, then ctx ends
		"http://user:" + secret + "/x@127.0.0.1:1",                        // a malformed URL
		"user:" + secret + "@127.0.0.1:1",                                 // refused: no scheme
	} {
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		code := runDemo(ctx, []string{"-url", url, "-orders", "1", "-seed", "1"}, func(string) string { return "" }, nil, &stdout, &stderr)
		cancel()
		if out := stdout.String() + stderr.String(); code == 0 || strings.Contains(out, secret) {
			t.Errorf("-url %s: exit %d, output shows the password:\n%s", url, code, out)
		}
	}
}
