package idemclient_test

import (
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/idemclient"
)

// A request built without a Header map, which http.Client.Do accepts, is
// sent with its key (Do and WithKey panicked on the nil map).
func TestRequestWithoutHeaderMap(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })
	c, _ := newClient(t, nil)
	u, _ := url.Parse(srv.URL + "/v1/payments")
	req := &http.Request{Method: http.MethodPost, URL: u, Body: http.NoBody}
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Do panicked: %v", p)
		}
	}()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	r2, err := idemclient.WithKey(&http.Request{Method: http.MethodPost, URL: u, Body: http.NoBody}, "k-1")
	if err != nil || r2.Header.Get(idemclient.HeaderKey) != "k-1" {
		t.Errorf("WithKey on a request without a Header map: %v, %v", r2, err)
	}
}

// MaxBodyBytes = MaxInt64 ("no limit") buffers the whole body (MaxBodyBytes+1
// overflowed and an empty body was sent).
func TestMaxBodyBytesNoLimit(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })
	c, _ := newClient(t, &idemclient.Config{MaxBodyBytes: math.MaxInt64})
	req := post(t, srv.URL, `{"amount":"1"}`)
	req.GetBody = nil // e.g. a body from a file or pipe
	req.Body = io.NopCloser(strings.NewReader(`{"amount":"1"}`))
	req.ContentLength = 0 // unknown length
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if as := rec.seen(); len(as) != 1 || as[0].body != `{"amount":"1"}` {
		t.Fatalf("server saw %+v, want the body", as)
	}
}

// The retry log of a transport error does not carry the URL's query (the
// error names the whole URL).
func TestTransportErrorLoggedWithoutQuery(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			hijackClose(t, w)
			return
		}
		w.WriteHeader(201)
	})
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, _ := newClient(t, &idemclient.Config{Logger: log})
	resp, err := c.Do(post(t, srv.URL+"/v1/payments?token=QUERY-SECRET", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "QUERY-SECRET") {
		t.Errorf("log carries the query:\n%s", logs.String())
	}
}
