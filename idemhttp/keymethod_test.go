package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
)

// Keys are scoped per principal, method and route, so one key sent with
// another method (to the same route) is another operation: it executes,
// it is not a key-reused mismatch as the docs and the problem's detail
// said ("a different method, request target or body"). Within a scope the
// fingerprint differs by target (path and query) or body only, and the
// key-reused detail names just those.
func TestKeyReusedWithAnotherMethodIsAnotherScope(t *testing.T) {
	t.Parallel()
	drv, err := sqlitedriver.Open(filepath.Join(t.TempDir(), "app.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(drv, &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "client-1", nil }})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	mux := http.NewServeMux()
	mux.Handle("/payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
	})))
	send := func(method, target string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, strings.NewReader(`{"amount":"1.00"}`))
		req.Header.Set("Idempotency-Key", "key-1")
		rr := httptest.NewRecorder()
		mux.ServeHTTP(rr, req)
		return rr
	}
	if rr := send("POST", "/payments"); rr.Code != http.StatusCreated {
		t.Fatalf("POST: %d %s", rr.Code, rr.Body)
	}
	if rr := send("PATCH", "/payments"); rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("PATCH with the POST's key: %d %s; want 201, executed (another scope)", rr.Code, rr.Body)
	}
	if runs != 2 {
		t.Fatalf("handler ran %d times; want 2 (POST and PATCH are two operations)", runs)
	}
	rr := send("POST", "/payments?retry=1")
	if rr.Code != http.StatusConflict {
		t.Fatalf("POST with another query: %d %s; want 409", rr.Code, rr.Body)
	}
	if body := rr.Body.String(); !strings.Contains(body, "key-reused") || strings.Contains(body, "method") {
		t.Fatalf("key-reused detail names the method, which never differs within a scope: %s", body)
	}
}
