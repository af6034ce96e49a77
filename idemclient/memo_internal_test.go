package idemclient

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"
)

// What Do remembers of a request (its generated key, its buffered body)
// goes with the request: a process sending millions of requests does not
// keep one entry per request it ever sent.
func TestRequestMemoForgetsCollectedRequests(t *testing.T) {
	t.Parallel()
	c, err := New(&Config{MaxBodyBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	wp := func() weak.Pointer[http.Request] {
		req, err := http.NewRequest(http.MethodPost, "http://example.invalid/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Body = http.NoBody
		if _, err := c.key(req); err != nil {
			t.Fatal(err)
		}
		req.Body = readCloser{strings.NewReader("0123456789"), http.NoBody}
		if _, err := c.bodySource(req); err != nil {
			t.Fatal(err)
		}
		return weak.Make(req)
	}()
	held := func() bool {
		_, k := generatedKeys.m.Load(wp)
		_, b := bufferedBodies.m.Load(wp)
		return k || b
	}
	if !held() {
		t.Fatal("nothing remembered of the request")
	}
	for deadline := time.Now().Add(30 * time.Second); held(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request was collected 30s ago and its entries are still held")
		}
		runtime.GC()
	}
}

// A gateway that forwards the incoming request itself (RequestURI cleared,
// URL set to the upstream's) with a chunked body: its Body (net/http's
// body of the incoming request) refers back to the request (for its
// trailers). What Do buffered of it still goes when the request is done
// with: a gateway running for weeks does not keep every request it
// forwarded, with up to MaxBodyBytes of body each.
func TestRequestMemoForgetsForwardedIncomingRequests(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	target, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(&Config{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		forwarded []weak.Pointer[http.Request]
	)
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		forwarded = append(forwarded, weak.Make(r))
		mu.Unlock()
		r.RequestURI = ""
		r.URL.Scheme, r.URL.Host = target.Scheme, target.Host
		r.Host = ""
		resp, err := c.Do(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	}))
	defer gateway.Close()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	const requests = 50
	for i := range requests {
		// No Content-Length: the body is sent chunked.
		req, err := http.NewRequest(http.MethodPost, gateway.URL+"/pay", io.MultiReader(strings.NewReader(`{"amount":"1.00"}`)))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	gateway.CloseClientConnections()
	held := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, wp := range forwarded {
			if _, ok := bufferedBodies.m.Load(wp); ok {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(20 * time.Second); held() > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		runtime.GC()
	}
	if n := held(); n > 0 {
		t.Fatalf("%d of the %d forwarded requests still have their body buffered 20s after they were answered: the requests are never collected", n, requests)
	}
}

// A request's Body is recognised by identity: the same pointer Body (held
// weakly) or the same comparable value, never another Body of its type.
func TestBodyIdentity(t *testing.T) {
	t.Parallel()
	pr, _ := io.Pipe()
	other, _ := io.Pipe()
	nop := io.NopCloser(strings.NewReader("x"))
	for _, c := range []struct {
		name     string
		from, to io.ReadCloser
		want     bool
	}{
		{"same pointer", pr, pr, true},
		{"another pointer of its type", pr, other, false},
		{"another type", pr, nop, false},
		{"same value", nop, nop, true},
		{"another value", nop, io.NopCloser(strings.NewReader("x")), false},
		{"nil", nil, nil, true},
		{"pointer, then nil", pr, nil, false},
	} {
		if got := bodyIdentity(c.from).is(c.to); got != c.want {
			t.Errorf("%s: is = %v, want %v", c.name, got, c.want)
		}
	}
}
