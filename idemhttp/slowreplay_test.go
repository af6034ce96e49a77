package idemhttp_test

import (
	"bytes"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// A replay read from the store (no cache) of a large response is written to
// a client that never reads it. The claim's transaction must have ended
// before: on SQLite it holds the database's only writer (every other
// request would wait), on PostgreSQL the key's lock (a second retry would
// get 409 in progress for a completed request) and a pooled connection.
func TestSlowReplayHoldsNothing(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		slowReplay[*sql.Tx](t, testdb.SQLite(t))
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		slowReplay[*sql.Tx](t, testdb.PostgresSQL(t))
	})
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		slowReplay[pgx.Tx](t, testdb.Postgres(t))
	})
}

func slowReplay[TTx any](t *testing.T, drv driver.RecordDriver[TTx]) {
	const bodySize = 16 << 20 // more than the sockets' buffers hold (4 MiB)
	mw, err := idemhttp.New(drv, &idemhttp.Config{
		// Reading the 32 MiB record under the race detector, on a busy
		// machine, may hold the lock for a second or two (pgsqldriver
		// reads it under the key's lock: over 10 s once, with the machine
		// running five other test suites); the stalled client would hold
		// it for ever.
		// Storing the record took over 30 s (the default CommitTimeout)
		// on SQLite in such a run: the first execution answered 503.
		Wait: 30 * time.Second, CommitTimeout: 2 * time.Minute,
		ReplayCacheBytes: idemhttp.NoReplayCache, MaxResponseBytes: 64 << 20,
		Scope: func(*http.Request) (string, error) { return "p", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), bodySize)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if r.URL.Path == "/small" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		_, _ = w.Write(body)
	})))
	t.Cleanup(srv.Close)
	post := func(path, key string) (int, string, error) {
		// Generous: 32 MiB (now 16) under the race detector on a loaded 2-core
		// machine took over 15 s. A replay that still held the key would
		// answer 409 after Wait (30 s), not time out.
		c := &http.Client{Timeout: 2 * time.Minute}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = resp.Body.Close() }()
		n, err := io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, fmt.Sprintf("%d bytes, replayed %q", n, resp.Header.Get(idemhttp.ReplayedHeader)), err
	}
	if code, got, err := post("/big", "k1"); err != nil || code != http.StatusOK {
		t.Fatalf("first execution: %d %s %v", code, got, err)
	}
	// The stalled client: asks for the replay and reads nothing.
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	_, _ = fmt.Fprintf(conn, "POST /big HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	time.Sleep(300 * time.Millisecond) // its replay is being written, and blocks
	if code, got, err := post("/small", "other"); err != nil || code != http.StatusOK {
		t.Errorf("another key while a replay is stalled: %d %s %v", code, got, err)
	}
	if code, got, err := post("/big", "k1"); err != nil || code != http.StatusOK || !strings.Contains(got, `replayed "true"`) {
		t.Errorf("a second retry while a replay is stalled: %d %s %v; want 200, the replay", code, got, err)
	}
}
