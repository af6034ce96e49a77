package idemclient

import (
	"net/http"
	"runtime"
	"strings"
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
