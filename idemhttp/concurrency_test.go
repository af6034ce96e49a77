package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// slowEffect is effectHandler with a pause after the write, so that
// duplicates arrive while the first execution is in flight.
func slowEffect(t *testing.T, e *env, calls *atomic.Int64, d time.Duration) http.Handler {
	inner := effectHandler(t, e, 201, calls)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		inner.ServeHTTP(w, r)
	})
}

// hammer sends n identical requests at once to the handlers (round robin)
// and returns the responses.
func hammer(n int, hs ...http.Handler) []*httptest.ResponseRecorder {
	return hammerKey(n, "one-key", "c", hs...)
}

// hammerKey is hammer with key, and the effect labelled label.
func hammerKey(n int, key, label string, hs ...http.Handler) []*httptest.ResponseRecorder {
	out := make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = send(hs[i%len(hs)], "POST", "/pay?label="+label, key, `{"amount":"1.00"}`)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// checkExactlyOnce asserts one execution: every response is that
// execution's (first or replayed) or a 409 in-progress with Retry-After.
func checkExactlyOnce(t *testing.T, e *env, calls *atomic.Int64, rs []*httptest.ResponseRecorder, allowInProgress bool) {
	t.Helper()
	if n := e.effects(t, "c"); n != 1 || calls.Load() != 1 {
		t.Fatalf("effects = %d, handler calls = %d; want exactly 1", n, calls.Load())
	}
	var bodyOf201 string
	executed, replayed, busy := 0, 0, 0
	for _, rr := range rs {
		switch rr.Code {
		case 201:
			if bodyOf201 == "" {
				bodyOf201 = rr.Body.String()
			}
			if rr.Body.String() != bodyOf201 {
				t.Fatalf("two different 201 bodies: %s and %s", bodyOf201, rr.Body)
			}
			if rr.Header().Get(idemhttp.ReplayedHeader) == "true" {
				replayed++
			} else {
				executed++
			}
		case 409:
			if !allowInProgress {
				t.Fatalf("409 although duplicates should wait: %s", rr.Body)
			}
			checkProblem(t, rr, 409, problem.TypeRequestInProgress)
			if rr.Header().Get("Retry-After") != "1" {
				t.Fatalf("Retry-After = %q", rr.Header().Get("Retry-After"))
			}
			busy++
		default:
			t.Fatalf("unexpected %d: %s", rr.Code, rr.Body)
		}
	}
	if executed != 1 {
		t.Fatalf("executed = %d, want 1 (replayed %d, in progress %d)", executed, replayed, busy)
	}
	t.Logf("%d requests: 1 executed, %d replayed, %d in progress", len(rs), replayed, busy)
}

// allInProgress reports whether every response is a 409.
func allInProgress(rs []*httptest.ResponseRecorder) bool {
	for _, rr := range rs {
		if rr.Code != 409 {
			return false
		}
	}
	return true
}

func TestConcurrentDuplicatesExecuteOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			t.Run("wait", func(t *testing.T) {
				t.Parallel()
				forEach(t, func(t *testing.T, e *env) {
					var calls atomic.Int64
					// A Wait no loaded machine exceeds: 100 duplicates
					// queue on one key, which SQLite serves one at a time.
					h := e.wrap(t, &idemhttp.Config{Mode: mode, Wait: time.Minute}, slowEffect(t, e, &calls, 50*time.Millisecond))
					checkExactlyOnce(t, e, &calls, hammer(100, h), false)
				})
			})
			t.Run("nowait", func(t *testing.T) {
				t.Parallel()
				forEach(t, func(t *testing.T, e *env) {
					var calls atomic.Int64
					h := e.wrap(t, &idemhttp.Config{Mode: mode, Wait: idemhttp.NoWait}, slowEffect(t, e, &calls, 50*time.Millisecond))
					rs := hammer(100, h)
					if allInProgress(rs) {
						// Only on an overloaded machine: SQLite's
						// NoWait waits a few milliseconds for the
						// connection, and the first duplicate's
						// transaction took longer than that to
						// begin. Every client was told to retry; the
						// retry executes, once.
						t.Log("every duplicate answered 409 in progress; sending the clients' retry")
						rs = append(rs, send(h, "POST", "/pay?label=c", "one-key", `{"amount":"1.00"}`))
					}
					checkExactlyOnce(t, e, &calls, rs, true)
				})
			})
		})
	}
}

// TestTwoPoolsOnePostgres stands for two server processes: two independent
// pools and middlewares on one database.
func TestTwoPoolsOnePostgres(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			schema := schemaOf(t, testdb.Postgres(t))
			// Two pools of 8: the two modes run at once, beside another
			// package's tests, on a server of 100 connections.
			a, err := pgdriver.New(testdb.Pool(t, schema, 8), &pgdriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			b, err := pgdriver.New(testdb.Pool(t, schema, 8), &pgdriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			ea, eb := pgEnvOn(t, a), pgEnvOn(t, b)
			var calls atomic.Int64
			ha := ea.wrap(t, &idemhttp.Config{Mode: mode, Wait: time.Minute}, slowEffect(t, ea, &calls, 30*time.Millisecond))
			hb := eb.wrap(t, &idemhttp.Config{Mode: mode, Wait: time.Minute}, slowEffect(t, eb, &calls, 30*time.Millisecond))
			checkExactlyOnce(t, ea, &calls, hammer(100, ha, hb), false)
		})
	}
}

func schemaOf(t *testing.T, d *pgdriver.Driver) string {
	t.Helper()
	var s string
	if err := d.Pool().QueryRow(t.Context(), "SELECT current_schema()").Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
