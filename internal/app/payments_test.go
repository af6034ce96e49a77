package app_test

import (
	"bytes"
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/idemkit/idem/problem"
)

var createdAtRe = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)

func TestCreateAndReplay(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		first := e.post("key-1", paymentBody("ext-1"))
		if first.status != http.StatusCreated {
			t.Fatalf("create: %d %s", first.status, first.body)
		}
		p := first.json(t)
		id, _ := p["id"].(string)
		want := map[string]any{"provider": "sber", "external_payment_id": "ext-1", "amount": "100.5000",
			"status": "PENDING", "customer_id": float64(42)}
		for k, v := range want {
			if p[k] != v {
				t.Errorf("%s = %#v, want %#v", k, p[k], v)
			}
		}
		if id == "" || first.header.Get("Location") != "/v1/payments/"+id {
			t.Errorf("id %q, Location %q", id, first.header.Get("Location"))
		}
		created, _ := p["created_at"].(string)
		if ts, err := time.Parse(time.RFC3339, created); !createdAtRe.MatchString(created) || err != nil || time.Since(ts) > time.Minute {
			t.Errorf("created_at %q, want RFC 3339 UTC with microseconds, about now", created)
		}
		if first.header.Get("Idempotent-Replayed") != "" {
			t.Error("first response marked as replayed")
		}

		again := e.post("key-1", paymentBody("ext-1"))
		if again.status != first.status || !bytes.Equal(again.body, first.body) {
			t.Errorf("replay: %d %s\nwant %d %s", again.status, again.body, first.status, first.body)
		}
		if again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Location") != first.header.Get("Location") ||
			again.header.Get("Content-Type") != first.header.Get("Content-Type") {
			t.Errorf("replay headers %v", again.header)
		}
		// Key order and whitespace do not matter to the fingerprint.
		reordered := e.post("key-1", `{ "customer_id": 42, "amount": "100.50", "external_payment_id": "ext-1", "provider": "sber" }`)
		if reordered.status != http.StatusCreated || !bytes.Equal(reordered.body, first.body) {
			t.Errorf("reordered body: %d %s, want the replay", reordered.status, reordered.body)
		}
		if n := e.count(); n != 1 {
			t.Errorf("%d payment rows, want 1", n)
		}
	})
}

func TestKeyReusedForOtherBody(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		if r := e.post("key-1", paymentBody("ext-1")); r.status != http.StatusCreated {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		r := e.post("key-1", paymentBody("ext-2"))
		if r.status != http.StatusConflict || r.problemType(t) != problem.TypeKeyReused {
			t.Errorf("same key, other body: %d %s; want 409 key-reused", r.status, r.body)
		}
		if n := e.count(); n != 1 {
			t.Errorf("%d payment rows, want 1", n)
		}
	})
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		r := e.post("", paymentBody("ext-1"))
		if r.status != http.StatusBadRequest || r.problemType(t) != problem.TypeKeyMissing {
			t.Errorf("no key: %d %s; want 400 key-missing", r.status, r.body)
		}
		if n := e.count(); n != 0 {
			t.Errorf("%d payment rows, want 0", n)
		}
	})
}

// A client that generates a new key on retry (R-DIST-IDEM-X3) still gets
// one payment: the UNIQUE constraint returns the existing one.
func TestOtherKeySamePayment(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		first := e.post("key-1", paymentBody("ext-1"))
		second := e.post("key-2", paymentBody("ext-1"))
		if first.status != http.StatusCreated || second.status != http.StatusOK {
			t.Fatalf("statuses %d, %d; want 201, 200 (%s)", first.status, second.status, second.body)
		}
		if first.json(t)["id"] != second.json(t)["id"] || !bytes.Equal(first.body, second.body) {
			t.Errorf("second key got %s, want the first payment %s", second.body, first.body)
		}
		if second.header.Get("Idempotent-Replayed") != "" || second.header.Get("Location") != "" {
			t.Errorf("existing payment answered with %v; want no replay mark and no Location", second.header)
		}
		// Replaying the second key replays its 200.
		if again := e.post("key-2", paymentBody("ext-1")); again.status != http.StatusOK || !bytes.Equal(again.body, second.body) {
			t.Errorf("replay of key-2: %d %s", again.status, again.body)
		}
		if n := e.count(); n != 1 {
			t.Errorf("%d payment rows, want 1", n)
		}
	})
}

// The same provider and external payment id with another amount or
// customer is not the same payment: 409 conflict (stored under the key),
// never a 200 that a client checking the status takes for its payment.
func TestOtherKeyOtherPaymentConflicts(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		first := e.post("key-1", `{"provider":"sber","external_payment_id":"ext-1","amount":"10.00","customer_id":42}`)
		if first.status != http.StatusCreated {
			t.Fatalf("create: %d %s", first.status, first.body)
		}
		for i, body := range []string{
			`{"provider":"sber","external_payment_id":"ext-1","amount":"99.00","customer_id":42}`,
			`{"provider":"sber","external_payment_id":"ext-1","amount":"10.00","customer_id":7}`,
		} {
			key := "other-" + string(rune('a'+i))
			r := e.post(key, body)
			if r.status != http.StatusConflict || r.problemType(t) != problem.TypeConflict {
				t.Fatalf("%s: %d %s; want 409 conflict", body, r.status, r.body)
			}
			if got := r.json(t)["payment"]; got != first.header.Get("Location") {
				t.Errorf("conflict names payment %v, want %s", got, first.header.Get("Location"))
			}
			again := e.post(key, body)
			if again.status != http.StatusConflict || again.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry of %s: %d replayed=%q; want the stored 409", key, again.status, again.header.Get("Idempotent-Replayed"))
			}
		}
		// The same payment, amount spelled differently, is still the same.
		if r := e.post("key-3", `{"provider":"sber","external_payment_id":"ext-1","amount":"10.0000","customer_id":42}`); r.status != http.StatusOK {
			t.Errorf("same payment, other spelling: %d %s; want 200", r.status, r.body)
		}
		if n := e.count(); n != 1 {
			t.Errorf("%d payment rows, want 1", n)
		}
	})
}

func TestGet(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		created := e.post("key-1", paymentBody("ext-1"))
		loc := created.header.Get("Location")
		got := e.do(http.MethodGet, loc, nil, "")
		if got.status != http.StatusOK || !bytes.Equal(got.body, created.body) {
			t.Errorf("GET %s: %d %s, want %s", loc, got.status, got.body, created.body)
		}
		for _, path := range []string{"/v1/payments/999999", "/v1/payments/abc", "/v1/payments/0", "/v1/payments/-1",
			"/v1/payments/01", "/v1/payments/99999999999999999999"} {
			r := e.do(http.MethodGet, path, nil, "")
			if r.status != http.StatusNotFound {
				t.Errorf("GET %s: %d, want 404", path, r.status)
			}
			r.problemType(t)
		}
	})
}

func TestValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		contentType string
		body        string
		status      int
		field       string
	}{
		{"unknown field", "", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1,"x":1}`, 400, ""},
		{"trailing data", "", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1} {}`, 400, ""},
		{"not JSON", "", `provider=p`, 400, ""},
		{"not an object", "", `["p"]`, 400, ""},
		{"missing amount", "", `{"provider":"p","external_payment_id":"e","customer_id":1}`, 422, "amount"},
		{"missing provider", "", `{"external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider"},
		{"amount as number", "", `{"provider":"p","external_payment_id":"e","amount":100.5,"customer_id":1}`, 422, "amount"},
		{"amount 5 decimals", "", `{"provider":"p","external_payment_id":"e","amount":"1.23456","customer_id":1}`, 422, "amount"},
		{"amount zero", "", `{"provider":"p","external_payment_id":"e","amount":"0","customer_id":1}`, 422, "amount"},
		{"amount negative", "", `{"provider":"p","external_payment_id":"e","amount":"-5.00","customer_id":1}`, 422, "amount"},
		{"amount 16 integer digits", "", `{"provider":"p","external_payment_id":"e","amount":"1234567890123456","customer_id":1}`, 422, "amount"},
		{"customer as string", "", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":"1"}`, 422, "customer_id"},
		{"customer fractional", "", `{"provider":"p","external_payment_id":"e","amount":"1","customer_id":1.5}`, 422, "customer_id"},
		{"empty external id", "", `{"provider":"p","external_payment_id":"","amount":"1","customer_id":1}`, 422, "external_payment_id"},
		{"provider too long", "", `{"provider":"` + string(bytes.Repeat([]byte("x"), 129)) + `","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider"},
		{"reserved provider", "", `{"provider":"idemd-saga","external_payment_id":"order-1","amount":"1","customer_id":1}`, 422, "provider"},
		{"reserved provider, other case", "", `{"provider":"IDEMD-x","external_payment_id":"e","amount":"1","customer_id":1}`, 422, "provider"},
		{"form content type", "application/x-www-form-urlencoded", paymentBody("e"), 415, ""},
	}
	databases(t, func(t *testing.T, e *env) {
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				key := "validation-" + string(rune('a'+i))
				var hdr []string
				if tt.contentType != "" {
					hdr = []string{"Content-Type", tt.contentType}
				}
				r := e.post(key, tt.body, hdr...)
				if r.status != tt.status {
					t.Fatalf("%d %s, want %d", r.status, r.body, tt.status)
				}
				typ := r.problemType(t)
				if tt.status == 400 || tt.status == 422 {
					if typ != problem.TypeValidation {
						t.Errorf("type %q, want validation", typ)
					}
				}
				if tt.field != "" {
					errs, _ := r.json(t)["errors"].([]any)
					first, _ := func() (map[string]any, bool) {
						if len(errs) == 0 {
							return nil, false
						}
						m, ok := errs[0].(map[string]any)
						return m, ok
					}()
					if first["field"] != tt.field {
						t.Errorf("errors %v, want field %s first", errs, tt.field)
					}
				}
				// A rejection is a deterministic outcome: replayed for the
				// same key; but a 415 is answered before the key is claimed.
				again := e.post(key, tt.body, hdr...)
				replayed := "true"
				if tt.status == http.StatusUnsupportedMediaType {
					replayed = ""
				}
				if again.status != r.status || !bytes.Equal(again.body, r.body) || again.header.Get("Idempotent-Replayed") != replayed {
					t.Errorf("retry: %d %s, want the stored %d", again.status, again.body, r.status)
				}
			})
		}
		t.Cleanup(func() {
			if n := e.count(); n != 0 {
				t.Errorf("%d payment rows after invalid requests, want 0", n)
			}
		})
	})
}

// A lone UTF-16 surrogate escape ("\ud800") is not text: encoding/json
// reads it as U+FFFD, so "e\ud800" and "e\udbff" were one external payment
// id, and the second charge, sent with its own key, was answered 200 with
// the first one's payment: one payment for two charges, under an
// external_payment_id neither client sent. Both are now 422, as is an
// order's SKU so spelt.
func TestLoneSurrogateEscapeRejected(t *testing.T) {
	t.Parallel()
	body := func(ext string) string {
		return `{"provider":"sber","external_payment_id":"` + ext + `","amount":"100.50","customer_id":42}`
	}
	databases(t, func(t *testing.T, e *env) {
		for i, tt := range []struct{ path, body, field string }{
			{"/v1/payments", body(`e\ud800`), "external_payment_id"},
			{"/v1/payments", body(`e\udbff`), "external_payment_id"},
			{"/v1/payments", body(`e\udc00\ud800`), "external_payment_id"},
			{"/v1/payments", body(`e\ud800\u0041`), "external_payment_id"},
			{"/v1/payments", `{"provider":"sber\udfff","external_payment_id":"e","amount":"1","customer_id":1}`, "provider"},
			{"/v1/orders", `{"customer_id":1,"amount":"1","items":[{"sku":"a\ud800","quantity":1}]}`, "items[0].sku"},
		} {
			r := e.do(http.MethodPost, tt.path, map[string]string{"Idempotency-Key": fmt.Sprint("lone-", i)}, tt.body)
			if r.status != http.StatusUnprocessableEntity {
				t.Errorf("POST %s %s: %d %s, want 422", tt.path, tt.body, r.status, r.body)
				continue
			}
			if typ := r.problemType(t); typ != problem.TypeValidation {
				t.Errorf("type %q", typ)
			}
			errs, _ := r.json(t)["errors"].([]any)
			if len(errs) != 1 || errs[0].(map[string]any)["field"] != tt.field {
				t.Errorf("POST %s %s: errors %v, want one for %s", tt.path, tt.body, errs, tt.field)
			}
		}
		if n := e.count(); n != 0 {
			t.Errorf("%d payments stored, want 0", n)
		}
		// A surrogate pair is one character, and accepted.
		r := e.do(http.MethodPost, "/v1/payments", map[string]string{"Idempotency-Key": "pair"}, body(`e\ud83d\ude00`))
		if r.status != http.StatusCreated || r.json(t)["external_payment_id"] != "e\U0001F600" {
			t.Errorf("surrogate pair: %d %s, want 201 with e\U0001F600", r.status, r.body)
		}
	})
}
