package app_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/idemkit/idem/problem"
)

// Keys are scoped by principal: two clients that happen to pick the same
// key both execute. What they then see depends on the payment they send.
func TestSameKeyOtherPrincipal(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		alice := []string{"Authorization", "Bearer alice-token"}
		bob := []string{"Authorization", "Bearer bob-token"}

		// Different payments under the same key: two payments, neither
		// client sees the other's response.
		a := e.post("shared-key", paymentBody("alice-1"), alice...)
		b := e.post("shared-key", paymentBody("bob-1"), bob...)
		anon := e.post("shared-key", paymentBody("anon-1"))
		for name, r := range map[string]response{"alice": a, "bob": b, "anonymous": anon} {
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("%s: %d %v %s; want a fresh 201", name, r.status, r.header, r.body)
			}
		}
		if a.json(t)["id"] == b.json(t)["id"] || b.json(t)["id"] == anon.json(t)["id"] {
			t.Errorf("ids %v, %v, %v; want three payments", a.json(t)["id"], b.json(t)["id"], anon.json(t)["id"])
		}

		// The same payment under the same key: bob's request executes (no
		// replay of alice's response), and the UNIQUE constraint answers
		// with the existing payment, 200 instead of 201.
		a2 := e.post("shared-key-2", paymentBody("both"), alice...)
		b2 := e.post("shared-key-2", paymentBody("both"), bob...)
		if a2.status != http.StatusCreated || b2.status != http.StatusOK {
			t.Fatalf("statuses %d, %d; want 201 then 200", a2.status, b2.status)
		}
		if b2.header.Get("Idempotent-Replayed") != "" || a2.json(t)["id"] != b2.json(t)["id"] {
			t.Errorf("bob got %v %s; want the existing payment, executed not replayed", b2.header, b2.body)
		}

		// Each principal's key still replays its own response; the
		// scheme is case-insensitive.
		if r := e.post("shared-key", paymentBody("bob-1"), "Authorization", "bearer bob-token"); !bytes.Equal(r.body, b.body) ||
			r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("bob's retry: %d %s, want bob's replay", r.status, r.body)
		}
		if n := e.count(); n != 4 {
			t.Errorf("%d payment rows, want 4", n)
		}
	})
}

func TestUnauthenticated(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		for _, auth := range []string{"Basic YWxpY2U6cHc=", "Bearer", "Bearer   ", "", "Token abc"} {
			post := e.post("key-1", paymentBody("ext-1"), "Authorization", auth)
			get := e.do(http.MethodGet, "/v1/payments/1", map[string]string{"Authorization": auth}, "")
			for _, r := range []response{post, get} {
				if r.status != http.StatusUnauthorized || r.problemType(t) != problem.TypeUnauthenticated ||
					r.header.Get("WWW-Authenticate") == "" {
					t.Errorf("Authorization %q: %d %s; want 401 unauthenticated", auth, r.status, r.body)
				}
			}
		}
		if n := e.count(); n != 0 {
			t.Errorf("%d payment rows, want 0", n)
		}
	})
}
