package idemhttp

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
)

// benchHandler answers 201 with a ~300 B JSON body, as a create command does.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/pay-7f3c2a9e")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(benchResponse)
})

// BenchmarkMiddleware measures a whole protected request through the
// middleware (ModeTx, the default) on each backend: a first execution (a new
// key every iteration) and a replay (the same key and body every iteration),
// answered from the replay cache (the default) or from the store.
func BenchmarkMiddleware(b *testing.B) {
	backends := []struct {
		name string
		mk   func(b *testing.B, cfg *Config) http.Handler
	}{
		{"sqlite", func(b *testing.B, cfg *Config) http.Handler { return benchWrap(b, testdb.SQLite(b), cfg) }},
		{"postgres", func(b *testing.B, cfg *Config) http.Handler { return benchWrap(b, testdb.Postgres(b), cfg) }},
		{"postgres-sql", func(b *testing.B, cfg *Config) http.Handler { return benchWrap(b, testdb.PostgresSQL(b), cfg) }},
	}
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			b.Run("execute", func(b *testing.B) {
				h := be.mk(b, nil)
				keys := make([]string, b.N)
				for i := range keys {
					keys[i] = "exec-" + strconv.Itoa(i)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if rr := benchSend(h, keys[i]); rr.Code != http.StatusCreated || rr.Header().Get(ReplayedHeader) != "" {
						b.Fatalf("execute: %d %s", rr.Code, rr.Body)
					}
				}
			})
			for _, rp := range []struct {
				name string
				cfg  *Config
			}{{"replay", nil}, {"replay-store", &Config{ReplayCacheBytes: NoReplayCache}}} {
				b.Run(rp.name, func(b *testing.B) {
					benchReplay(b, be.mk(b, rp.cfg))
				})
			}
		})
	}
}

func benchReplay(b *testing.B, h http.Handler) {
	if rr := benchSend(h, "replay-key"); rr.Code != http.StatusCreated {
		b.Fatalf("first: %d %s", rr.Code, rr.Body)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if rr := benchSend(h, "replay-key"); rr.Code != http.StatusCreated || rr.Header().Get(ReplayedHeader) != "true" {
			b.Fatalf("replay: %d %s", rr.Code, rr.Body)
		}
	}
}

func benchWrap[TTx any](b *testing.B, drv driver.Driver[TTx], cfg *Config) http.Handler {
	mw, err := New(drv, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return mw.Handler(benchHandler)
}

func benchSend(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader(benchPayment))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(KeyHeader, key)
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	return rr
}
