package idemhttp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// TestBodyReadTimeoutIsRetryable: a client whose body does not arrive
// within the server's read deadline (http.Server.ReadTimeout: a slow or
// stalled upload) is still connected and reads the answer. It is 408
// body-timeout, which says "send it again" (idemclient retries 408),
// not a final 400 validation, which tells a client to fix a request that
// was fine: nothing ran, nothing was stored, the key was not claimed, and
// the resent request executes once.
func TestBodyReadTimeoutIsRetryable(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		h := e.wrap(t, &idemhttp.Config{}, effectHandler(t, e, http.StatusCreated, &calls))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ReadTimeout: 300 * time.Millisecond}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()

		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Half of the body, then nothing.
		fmt.Fprintf(c, "POST /pay?label=slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"Idempotency-Key: slow\r\nContent-Length: 12\r\n\r\n{\"a\":")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var p problem.Problem
		_ = json.Unmarshal(b, &p)
		if res.StatusCode != http.StatusRequestTimeout || p.Type != problem.TypeBodyTimeout ||
			res.Header.Get("Content-Type") != problem.MediaType {
			t.Fatalf("stalled body: %d %s, want 408 %s", res.StatusCode, b, problem.TypeBodyTimeout)
		}

		// The key is free: the whole request, resent, executes once.
		req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/pay?label=slow", strings.NewReader(`{"a":"bcdef"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "slow")
		res, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusCreated || res.Header.Get(idemhttp.ReplayedHeader) != "" || e.effects(t, "slow") != 1 {
			t.Fatalf("resent: %d replayed %q, effects %d; want 201 executed once", res.StatusCode,
				res.Header.Get(idemhttp.ReplayedHeader), e.effects(t, "slow"))
		}
	})
}
