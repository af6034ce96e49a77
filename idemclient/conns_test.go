package idemclient_test

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/problem"
)

// countingListener counts the connections a server accepted.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// Every way Do ends or retries leaves the connection reusable: the bodies
// of the responses it retries, stops at (key-reused, request-in-progress
// given up, a Retry-After too long) or reads the problem type of (gzip
// included) are drained and closed, so a client sending one request after
// another, on a keep-alive transport, uses one connection.
func TestOneConnectionAcrossRetries(t *testing.T) {
	t.Parallel()
	answers := map[string]func(w http.ResponseWriter){
		"503 problem": func(w http.ResponseWriter) {
			problem.WriteError(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "t", strings.Repeat("d", 3000))
		},
		"409 request-in-progress": func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "1")
			problem.WriteError(w, http.StatusConflict, problem.TypeRequestInProgress, "t", "d")
		},
		"409 key-reused": func(w http.ResponseWriter) {
			problem.WriteError(w, http.StatusConflict, problem.TypeKeyReused, "t", strings.Repeat("d", 3000))
		},
		"503 Retry-After too long": func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "3600")
			problem.WriteError(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "t", "d")
		},
		"500 transaction-ended": func(w http.ResponseWriter) {
			problem.WriteError(w, http.StatusInternalServerError, problem.TypeTransactionEnded, "t", "d")
		},
		"503 gzip problem": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", problem.MediaType)
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusServiceUnavailable)
			zw := gzip.NewWriter(w)
			fmt.Fprintf(zw, `{"type":%q,"detail":"%s"}`, problem.TypeStoreUnavailable, strings.Repeat("d", 3000))
			_ = zw.Close()
		},
		"503 plain": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, strings.Repeat("busy ", 1000))
		},
	}
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				answer(w)
			}))
			l := &countingListener{Listener: srv.Listener}
			srv.Listener = l
			srv.Start()
			t.Cleanup(srv.Close)
			tr := &http.Transport{DisableCompression: true} // the gzip body reaches Do as sent
			t.Cleanup(tr.CloseIdleConnections)
			c, err := idemclient.New(&idemclient.Config{
				MaxAttempts: 3,
				HTTPClient:  &http.Client{Transport: tr, Timeout: 10 * time.Second},
				Sleep:       func(ctx context.Context, _ time.Duration) error { return ctx.Err() },
			})
			if err != nil {
				t.Fatal(err)
			}
			for range 5 {
				resp, err := c.Do(post(t, srv.URL, "{}"))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			if n := l.n.Load(); n != 1 {
				t.Errorf("%d connections for 5 operations of up to 3 attempts; want 1", n)
			}
		})
	}
}
