package idemclient_test

import (
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/problem"
)

// jittered reports whether d is a wait for a Retry-After of ra: ra plus at
// most a tenth of it (Config.RetryAfterJitter's default), never less.
func jittered(d, ra time.Duration) bool {
	return d >= ra && d <= ra+ra/10
}

// A server that answers many clients 503 with the same Retry-After does
// not get them all back at the same instant (a thundering herd that can
// take it down again): each waits the Retry-After plus a random extra of
// at most a tenth of it, never less than the server asked.
func TestRetryAfterJitterSpreadsClients(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]bool{}
	srv, _ := server(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemclient.HeaderKey)
		mu.Lock()
		first := !seen[key]
		seen[key] = true
		mu.Unlock()
		if first {
			writeProblem(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "2")
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	const clients = 20
	var waits []time.Duration
	for range clients {
		c, s := newClient(t, nil)
		resp, err := c.Do(post(t, srv.URL, "{}"))
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("status %d", resp.StatusCode)
		}
		ds := s.delays()
		if len(ds) != 1 {
			t.Fatalf("waits %v, want one", ds)
		}
		waits = append(waits, ds[0])
	}
	for _, d := range waits {
		if !jittered(d, 2*time.Second) {
			t.Errorf("wait %s; want the Retry-After (2s) plus at most a tenth of it", d)
		}
	}
	// 20 uniform draws over 200ms all within 20ms of one another: about
	// 20 * 0.1^19.
	if spread := slices.Max(waits) - slices.Min(waits); spread < 20*time.Millisecond {
		t.Errorf("%d clients told Retry-After: 2 wait %v (spread %s): they all come back at once", clients, waits, spread)
	}
}
