package cleanup_test

import (
	"database/sql"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// A replica whose host clock runs days ahead (a bad NTP server, an RTC
// reset) sweeps with the default clock. Other replicas, on correct
// clocks, wrote an idempotency record (24h TTL) and an inbox row minutes
// ago: the sweep must not delete them, or a client's retry executes the
// command again and a redelivered event is processed twice. The host's
// clock is replaced per cleaner (Cleaner.SetHostClock), the system clock
// is not touched.
func TestSweepWithTheHostClockAhead(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		drv := testdb.Postgres(t)
		testSweepWithTheHostClockAhead[pgx.Tx](t, drv, pgReplica(t, drv))
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		drv := testdb.SQLite(t)
		testSweepWithTheHostClockAhead[*sql.Tx](t, drv, sqliteReplica(t, drv))
	})
	t.Run("postgres-sql", func(t *testing.T) {
		t.Parallel()
		drv := testdb.PostgresSQL(t)
		testSweepWithTheHostClockAhead[*sql.Tx](t, drv, pgsqlReplica(t, drv))
	})
}

func testSweepWithTheHostClockAhead[TTx any](t *testing.T, drv, sweeper driver.Driver[TTx]) {
	ctx := t.Context()
	mw, err := idemhttp.New(drv, &idemhttp.Config{ReplayCacheBytes: idemhttp.NoReplayCache,
		Scope: func(*http.Request) (string, error) { return "tenant-1", nil }})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	post := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "pay-1")
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		return rr
	}
	if rr := post(); rr.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", rr.Code, rr.Body)
	}
	event := uuid.Must(uuid.NewV7())
	if got, err := drv.Executor().InboxInsert(ctx, &driver.InboxInsertParams{Consumer: consumerA, IDs: []uuid.UUID{event}, Now: time.Now()}); err != nil || len(got) != 1 {
		t.Fatalf("InboxInsert = %v, %v", got, err)
	}

	var logs testlog.Buffer
	c, err := cleanup.New(sweeper, &cleanup.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c.SetHostClock(func() time.Time { return time.Now().Add(4 * 24 * time.Hour) })
	rep, err := c.RunOnce(ctx)
	if err != nil || rep.Skipped {
		t.Fatalf("RunOnce = %+v, %v", rep, err)
	}

	if rr := post(); rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "true" || calls.Load() != 1 {
		t.Errorf("retry seconds into the record's 24h, after a sweep by a host 4 days ahead: %d replayed=%q, handler ran %d times (sweep deleted %d rows); want the stored 201, handler run once",
			rr.Code, rr.Header().Get(idemhttp.ReplayedHeader), calls.Load(), rep.TotalDeleted())
	}
	if got, err := drv.Executor().InboxInsert(ctx, &driver.InboxInsertParams{Consumer: consumerA, IDs: []uuid.UUID{event}, Now: time.Now()}); err != nil || len(got) != 0 {
		t.Errorf("the event recorded minutes ago is new again after the sweep (%v, %v): a redelivery is processed twice", got, err)
	}
	if !strings.Contains(logs.String(), "clock disagrees with the database's") {
		t.Errorf("no warning of the host's clock 4 days ahead. Logs:\n%s", logs.String())
	}
}
