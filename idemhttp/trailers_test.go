package idemhttp_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
)

// trailerHandler writes an effect and answers 201 with a body naming the
// execution and three trailers: X-Checksum declared in a Trailer header
// before WriteHeader and set after the body, X-Digest and X-Secret set
// after the body with http.TrailerPrefix.
func trailerHandler(t *testing.T, e *env, label string, calls *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if err := e.effect(r, label); err != nil {
			t.Errorf("effect: %v", err)
			http.Error(w, err.Error(), 500)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/plain")
		h.Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, "execution %d", n)
		h.Set("X-Checksum", fmt.Sprintf("sum-%d", n))
		h.Set(http.TrailerPrefix+"X-Digest", fmt.Sprintf("digest-%d", n))
		h.Set(http.TrailerPrefix+"X-Secret", "secret")
	})
}

// trailerResponse is what a client read: the trailers once the body is read.
type trailerResponse struct {
	status   int
	body     string
	replayed string
	trailer  http.Header
}

func postForTrailers(t *testing.T, url, key string) trailerResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/pay", strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.KeyHeader, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body) // the trailers arrive after the body
	if err != nil {
		t.Fatal(err)
	}
	return trailerResponse{resp.StatusCode, string(b), resp.Header.Get(idemhttp.ReplayedHeader), resp.Trailer}
}

// TestTrailersReplayed: the trailers a handler sets, in either net/http
// convention, are stored with the response when their names are replayed
// headers, and a retry gets them again: from the store and from the replay
// cache, in both modes. A trailer not listed goes out the first time only.
func TestTrailersReplayed(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
			for _, cache := range []int64{0, idemhttp.NoReplayCache} {
				// With Trailer itself listed, the replay announces the
				// declared trailer as the first response did, and its
				// value must still go out once.
				for _, declare := range []bool{false, true} {
					name := fmt.Sprintf("%s/cache=%d/declare=%v", mode, cache, declare)
					label := strings.NewReplacer("/", "-", "=", "-").Replace(name)
					cfg := &idemhttp.Config{Mode: mode, ReplayCacheBytes: cache,
						ReplayHeaders: []string{"X-Checksum", "X-Digest"},
						Scope:         func(*http.Request) (string, error) { return "p", nil },
						Logger:        slog.New(slog.DiscardHandler)}
					if declare {
						cfg.ReplayHeaders = append(cfg.ReplayHeaders, "Trailer")
					}
					var calls atomic.Int64
					// Two instances: b has nothing cached when it is first asked.
					a := httptest.NewServer(e.wrap(t, cfg, trailerHandler(t, e, label, &calls)))
					b := httptest.NewServer(e.wrap(t, cfg, trailerHandler(t, e, label, &calls)))

					first := postForTrailers(t, a.URL, label)
					want := http.Header{"X-Checksum": {"sum-1"}, "X-Digest": {"digest-1"}, "X-Secret": {"secret"}}
					if first.status != http.StatusCreated || first.body != "execution 1" || first.replayed != "" ||
						fmt.Sprint(first.trailer) != fmt.Sprint(want) {
						t.Fatalf("%s: first response %d %q replayed %q, trailers %v; want 201 %q, trailers %v",
							name, first.status, first.body, first.replayed, first.trailer, "execution 1", want)
					}
					delete(want, "X-Secret") // not a replayed header
					for i, url := range []string{a.URL, b.URL, b.URL} {
						got := postForTrailers(t, url, label)
						if got.status != http.StatusCreated || got.body != "execution 1" || got.replayed != "true" ||
							fmt.Sprint(got.trailer) != fmt.Sprint(want) {
							t.Errorf("%s: replay %d: %d %q replayed %q, trailers %v; want 201 %q replayed, trailers %v",
								name, i, got.status, got.body, got.replayed, got.trailer, "execution 1", want)
						}
					}
					if n, effects := calls.Load(), e.effects(t, label); n != 1 || effects != 1 {
						t.Errorf("%s: %d executions, %d effects; want 1", name, n, effects)
					}
					a.Close()
					b.Close()
				}
			}
		}
	})
}

// TestNoTrailersReplayFraming: a response without trailers is replayed as
// before, with a Content-Length, not chunked: from the store and from the
// replay cache, in both modes.
func TestNoTrailersReplayFraming(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
			for _, cache := range []int64{0, idemhttp.NoReplayCache} {
				name := fmt.Sprintf("%s/cache=%d", mode, cache)
				cfg := &idemhttp.Config{Mode: mode, ReplayCacheBytes: cache, ReplayHeaders: []string{"X-Checksum"},
					Scope: func(*http.Request) (string, error) { return "p", nil }, Logger: slog.New(slog.DiscardHandler)}
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("X-Checksum", "sum")
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, "plain")
				})
				a, b := httptest.NewServer(e.wrap(t, cfg, h)), httptest.NewServer(e.wrap(t, cfg, h))
				for i, url := range []string{a.URL, a.URL, b.URL, b.URL} {
					req, _ := http.NewRequest(http.MethodPost, url+"/pay", strings.NewReader(`{}`))
					req.Header.Set(idemhttp.KeyHeader, "plain-"+name)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					got := body(t, resp.Body)
					_ = resp.Body.Close()
					if got != "plain" || resp.ContentLength != 5 || len(resp.TransferEncoding) != 0 || len(resp.Trailer) != 0 ||
						resp.Header.Get("X-Checksum") != "sum" || (i > 0) != (resp.Header.Get(idemhttp.ReplayedHeader) == "true") {
						t.Errorf("%s: response %d: %q, Content-Length %d, Transfer-Encoding %v, trailers %v, headers %v",
							name, i, got, resp.ContentLength, resp.TransferEncoding, resp.Trailer, resp.Header)
					}
				}
				a.Close()
				b.Close()
			}
		}
	})
}
