package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemhttp"
)

// TestEmptyBodyReplayedWithLength: a stored response without a body (a
// handler that writes nothing, or only a status) is replayed as it went
// out the first time, with Content-Length: 0, not as a chunked response of
// unknown length; from the store as from the replay cache.
func TestEmptyBodyReplayedWithLength(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		for _, c := range []struct {
			cache  int64
			status int
		}{{0, 202}, {idemhttp.NoReplayCache, 202}, {0, 204}, {idemhttp.NoReplayCache, 204}} {
			cache, status := c.cache, c.status
			srv := httptest.NewServer(e.wrap(t, &idemhttp.Config{ReplayCacheBytes: cache,
				Scope: func(*http.Request) (string, error) { return "p", nil },
			}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(status)
			})))
			key := "empty-" + strings.TrimPrefix(srv.URL, "http://")
			var first string
			for attempt := range 3 {
				req, _ := http.NewRequest("POST", srv.URL+"/x", strings.NewReader("{}"))
				req.Header.Set("Idempotency-Key", key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if attempt == 0 {
					first = resp.Header.Get("Content-Length")
				}
				if resp.StatusCode != status || resp.ContentLength != 0 || len(resp.TransferEncoding) != 0 ||
					resp.Header.Get("Content-Length") != first {
					t.Errorf("cache %d, attempt %d: status %d, Content-Length %q (%d), Transfer-Encoding %v; want %d with Content-Length %q as the first time",
						cache, attempt, resp.StatusCode, resp.Header.Get("Content-Length"), resp.ContentLength, resp.TransferEncoding, status, first)
				}
			}
			srv.Close()
		}
	})
}
