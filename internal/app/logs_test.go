package app_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// No log line, at any level, carries a request body, a payment amount or an
// Authorization value: requests that succeed, replay, conflict, fail
// validation or are refused are logged by route, status and outcome only.
func TestLogsCarryNoSecretsOrAmounts(t *testing.T) {
	t.Parallel()
	logs := &testlog.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg, err := app.ParseConfig([]string{"-db", testdb.SQLitePath(t), "-kafka-dir", t.TempDir()}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(func() { srv.Close(); a.Close() })

	const (
		token  = "tok-SECRET-5d1e"
		amount = "98765.43"
		marker = "BODY-MARKER-77"
	)
	send := func(path, auth, key, body string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		return res.StatusCode
	}
	pay := `{"provider":"sber","external_payment_id":"` + marker + `","amount":"` + amount + `","customer_id":42}`
	order := `{"customer_id":42,"amount":"` + amount + `","items":[{"sku":"` + marker + `","quantity":2}]}`
	bearer := "Bearer " + token
	for _, c := range []struct {
		path, auth, key, body string
		want                  int
	}{
		{"/v1/payments", bearer, "k-1", pay, http.StatusCreated},
		{"/v1/payments", bearer, "k-1", pay, http.StatusCreated},                                            // replay
		{"/v1/payments", bearer, "k-1", strings.Replace(pay, "42", "43", 1), http.StatusConflict},           // key reused
		{"/v1/payments", bearer, "k-2", pay, http.StatusOK},                                                 // same payment, new key
		{"/v1/payments", bearer, "", pay, http.StatusBadRequest},                                            // no key
		{"/v1/payments", bearer, "k-3", `{"amount":"` + amount + `","x":"` + marker, http.StatusBadRequest}, // broken JSON
		{"/v1/payments", "Basic " + token, "k-4", pay, http.StatusUnauthorized},
		{"/v1/orders", bearer, "o-1", order, http.StatusCreated},
		{"/v1/orders", bearer, "o-2", strings.Replace(order, amount, "-"+amount, 1), http.StatusUnprocessableEntity},
	} {
		if got := send(c.path, c.auth, c.key, c.body); got != c.want {
			t.Errorf("POST %s (key %q): %d, want %d", c.path, c.key, got, c.want)
		}
	}
	// Let the relay and the consumers log what they do with the order.
	time.Sleep(500 * time.Millisecond)
	out := logs.String()
	if !strings.Contains(out, `"status":409`) {
		t.Fatalf("the access log shows no requests; logs:\n%s", out)
	}
	for _, secret := range []string{token, amount, "9876543", marker} {
		if strings.Contains(out, secret) {
			for line := range strings.Lines(out) {
				if strings.Contains(line, secret) {
					t.Errorf("a log line carries %q: %s", secret, line)
				}
			}
		}
	}
}
