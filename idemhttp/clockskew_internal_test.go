package idemhttp

import (
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// Two replicas of a ModeLease service share a database; the host of one
// runs 45s off (a VM resumed from suspend, a broken NTP daemon), more
// than the 20s of lease a renewal leaves at the default Lease of 30s.
// With each replica's default clock, a retry that reaches the other
// replica while the first one's handler runs must not take the key over
// (and make the payment again): it answers 409 request-in-progress. The
// host's clock is replaced per middleware (dbclock.Clock.SetHostClock),
// the system clock is not touched.
func TestLeaseHeldAcrossSkewedHosts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// owner and taker are how far the hosts of the replica that runs
		// the handler and of the one that gets the retry are off.
		owner, taker time.Duration
	}{
		{"taker-ahead", 0, 45 * time.Second},
		{"owner-behind", -45 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t.Run("sqlite", func(t *testing.T) {
				t.Parallel()
				testLeaseHeldAcrossSkewedHosts[*sql.Tx](t, testdb.SQLite(t), tc.owner, tc.taker)
			})
			t.Run("pgdriver", func(t *testing.T) {
				t.Parallel()
				testLeaseHeldAcrossSkewedHosts[pgx.Tx](t, testdb.Postgres(t), tc.owner, tc.taker)
			})
			t.Run("pgsqldriver", func(t *testing.T) {
				t.Parallel()
				testLeaseHeldAcrossSkewedHosts[*sql.Tx](t, testdb.PostgresSQL(t), tc.owner, tc.taker)
			})
		})
	}
}

func skewedMiddleware[TTx any](t *testing.T, drv driver.RecordDriver[TTx], off time.Duration, logs *testlog.Buffer) *Middleware[TTx] {
	t.Helper()
	m, err := New(drv, &Config{Mode: ModeLease, Wait: NoWait, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Scope: func(*http.Request) (string, error) { return "p", nil }})
	if err != nil {
		t.Fatal(err)
	}
	if m.clock == nil {
		t.Fatal("ModeLease with the default clock has no database-corrected clock")
	}
	m.clock.SetHostClock(func() time.Time { return time.Now().Add(off) })
	return m
}

func testLeaseHeldAcrossSkewedHosts[TTx any](t *testing.T, drv driver.RecordDriver[TTx], ownerOff, takerOff time.Duration) {
	var ownerLogs, takerLogs testlog.Buffer
	owner := skewedMiddleware(t, drv, ownerOff, &ownerLogs)
	taker := skewedMiddleware(t, drv, takerOff, &takerLogs)

	var calls atomic.Int64
	running, finish := make(chan struct{}), make(chan struct{})
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(running)
			select {
			case <-finish:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"charged":true}`)
	})
	post := func(h http.Handler) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/charge", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k1")
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		return rr
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(owner.Handler(charge)) }()
	select {
	case <-running:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request's handler did not start")
	}
	retry := post(taker.Handler(charge))
	close(finish)
	if rr := <-first; rr.Code != http.StatusCreated {
		t.Errorf("first request: %d %s", rr.Code, rr.Body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for one key while its first run was alive (retry answered %d); want 1", n, retry.Code)
	}
	if retry.Code != http.StatusConflict {
		t.Errorf("retry during the first run: %d %s; want 409 request-in-progress", retry.Code, retry.Body)
	}
	// Once stored, either replica replays it.
	for _, m := range []*Middleware[TTx]{owner, taker} {
		if rr := post(m.Handler(charge)); rr.Code != http.StatusCreated || rr.Header().Get(ReplayedHeader) != "true" {
			t.Errorf("retry after the outcome: %d %q replayed=%q; want the stored 201", rr.Code, rr.Body, rr.Header().Get(ReplayedHeader))
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times; want 1", n)
	}
	// The operator hears of the host that is off, and only of it.
	for _, r := range []struct {
		name string
		off  time.Duration
		logs *testlog.Buffer
	}{{"owner", ownerOff, &ownerLogs}, {"taker", takerOff, &takerLogs}} {
		warned := strings.Contains(r.logs.String(), "clock disagrees with the database's")
		if want := r.off != 0; warned != want {
			t.Errorf("%s, host %s off: warned of the skew = %v; want %v. Logs:\n%s", r.name, r.off, warned, want, r.logs.String())
		}
		if r.off != 0 {
			// The measured offset is known to half a round trip: -45s may
			// be logged as -44.996s.
			m := regexp.MustCompile(`host_clock_ahead=(\S+)`).FindStringSubmatch(r.logs.String())
			var got time.Duration
			if m != nil {
				got, _ = time.ParseDuration(m[1])
			}
			if m == nil || (got-r.off).Abs() > time.Second {
				t.Errorf("%s: the warning does not say host_clock_ahead=%s (within 1s). Logs:\n%s", r.name, r.off, r.logs.String())
			}
		}
	}
}

// A replica on a host whose clock runs more than the TTL ahead (a bad NTP
// server, an RTC reset) judges every record expired: a retry of a
// command completed minutes ago by another replica executes again. With
// the default clock it replays, in both modes.
func TestRecordLiveOnAHostDaysAhead(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeTx, ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			t.Run("sqlite", func(t *testing.T) {
				t.Parallel()
				testRecordLiveOnAHostDaysAhead[*sql.Tx](t, testdb.SQLite(t), mode)
			})
			t.Run("pgdriver", func(t *testing.T) {
				t.Parallel()
				testRecordLiveOnAHostDaysAhead[pgx.Tx](t, testdb.Postgres(t), mode)
			})
			t.Run("pgsqldriver", func(t *testing.T) {
				t.Parallel()
				testRecordLiveOnAHostDaysAhead[*sql.Tx](t, testdb.PostgresSQL(t), mode)
			})
		})
	}
}

func testRecordLiveOnAHostDaysAhead[TTx any](t *testing.T, drv driver.RecordDriver[TTx], mode Mode) {
	newMW := func(off time.Duration, logs *testlog.Buffer) *Middleware[TTx] {
		m, err := New(drv, &Config{Mode: mode, ReplayCacheBytes: NoReplayCache, Logger: slog.New(slog.NewTextHandler(logs, nil)),
			Scope: func(*http.Request) (string, error) { return "p", nil }})
		if err != nil {
			t.Fatal(err)
		}
		if m.clock == nil {
			t.Fatalf("%s with the default clock has no database-corrected clock", mode)
		}
		m.clock.SetHostClock(func() time.Time { return time.Now().Add(off) })
		return m
	}
	var goodLogs, aheadLogs testlog.Buffer
	good, ahead := newMW(0, &goodLogs), newMW(25*time.Hour, &aheadLogs)
	var calls atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	post := func(m *Middleware[TTx]) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/charge", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k1")
		rr := httptest.NewRecorder()
		m.Handler(charge).ServeHTTP(rr, req)
		return rr
	}
	if rr := post(good); rr.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", rr.Code, rr.Body)
	}
	rr := post(ahead)
	if n := calls.Load(); n != 1 || rr.Code != http.StatusCreated || rr.Header().Get(ReplayedHeader) != "true" {
		t.Fatalf("retry on the replica 25h ahead: %d replayed=%q, handler ran %d times; want the stored 201, handler run once",
			rr.Code, rr.Header().Get(ReplayedHeader), n)
	}
	if !strings.Contains(aheadLogs.String(), "clock disagrees with the database's") {
		t.Errorf("no warning of the host 25h ahead. Logs:\n%s", aheadLogs.String())
	}
}

// The taker's host clock is stepped 45 s forward (NTP correcting a VM
// resumed from suspend) between two of its requests, less than the 10 s
// between two measurements of the database's clock: the retry must not
// take over the key of the handler still running on the other replica.
func TestLeaseHeldAfterAHostClockStep(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testLeaseHeldAfterAHostClockStep[*sql.Tx](t, testdb.SQLite(t))
	})
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		testLeaseHeldAfterAHostClockStep[pgx.Tx](t, testdb.Postgres(t))
	})
}

func testLeaseHeldAfterAHostClockStep[TTx any](t *testing.T, drv driver.RecordDriver[TTx]) {
	var ownerLogs, takerLogs testlog.Buffer
	owner := skewedMiddleware(t, drv, 0, &ownerLogs)
	taker := skewedMiddleware(t, drv, 0, &takerLogs)
	var step atomic.Int64
	taker.clock.SetHostClock(func() time.Time { return time.Now().Add(time.Duration(step.Load())) })

	var calls atomic.Int64
	running, finish := make(chan struct{}), make(chan struct{})
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "k1" && calls.Add(1) == 1 {
			close(running)
			select {
			case <-finish:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	post := func(h http.Handler, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/charge", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		return rr
	}
	// The taker measured the database's clock (its host agreed).
	if rr := post(taker.Handler(charge), "k0"); rr.Code != http.StatusCreated {
		t.Fatalf("warm-up request: %d %s", rr.Code, rr.Body)
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(owner.Handler(charge), "k1") }()
	select {
	case <-running:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request's handler did not start")
	}
	step.Store(int64(45 * time.Second))
	retry := post(taker.Handler(charge), "k1")
	close(finish)
	if rr := <-first; rr.Code != http.StatusCreated {
		t.Errorf("first request: %d %s", rr.Code, rr.Body)
	}
	if n := calls.Load(); n != 1 || retry.Code != http.StatusConflict {
		t.Fatalf("retry after the taker's host clock stepped 45 s: %d, handler ran %d times; want 409, once", retry.Code, n)
	}
}
