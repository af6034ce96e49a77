package app_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/app"
)

// Slow clients (slowloris): 100 connections send a request's headers a
// few bytes at a time and never finish them. idemd closes each within its
// header read timeout (10 s) plus a margin, whatever the client keeps
// sending, and a normal client is served meanwhile.
func TestSlowHeaderClientsCutOff(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, app.SQLite)
	s, _ := start(t, dbArg, t.TempDir(), count, io.Discard)
	addr := strings.TrimPrefix(s.base, "http://")
	const conns = 100
	closedAfter := make([]time.Duration, conns)
	var wg sync.WaitGroup
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		start := time.Now()
		if _, err := io.WriteString(c, "POST /v1/payments HTTP/1.1\r\nHost: idemd\r\n"); err != nil {
			t.Fatal(err)
		}
		// A header byte every 500 ms, never the blank line.
		wg.Go(func() {
			for {
				if _, err := c.Write([]byte("X")); err != nil {
					return
				}
				time.Sleep(500 * time.Millisecond)
				if time.Since(start) > time.Minute {
					return
				}
			}
		})
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			_, _ = io.Copy(io.Discard, c) // until the server closes it
			closedAfter[i] = time.Since(start)
			_ = c.Close()
		})
	}
	res, err := http.Get(s.base + "/livez")
	if err != nil {
		t.Fatalf("a normal client among the slow ones: %v", err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("GET /livez: %d", res.StatusCode)
	}
	wg.Wait()
	var longest time.Duration
	for i, d := range closedAfter {
		longest = max(longest, d)
		if d > 25*time.Second {
			t.Errorf("slow connection %d held for %s; the header read timeout is 10s", i, d.Round(time.Millisecond))
		}
	}
	t.Logf("slow connections closed after %s at most", longest.Round(time.Millisecond))
}
